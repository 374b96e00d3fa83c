"""The log format: round trips, framing, checkpoints, the recorder, upcasters, golden bytes."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from log_helpers import event_strategy, planner_workload

from kvstate import Engine, Geometry, apply_all, initial_state
from kvstate.events import (
    EVENT_TYPES,
    Allocate,
    Append,
    Assign,
    BlockAlloc,
    BlockCache,
    BlockClear,
    BlockHold,
    BlockRelease,
    BlockUncache,
    Copy,
    Event,
    EventDecodeError,
    Evict,
    Free,
    FreeMapped,
    HostFree,
    Insert,
    Load,
    Lock,
    Offload,
    ReqAlloc,
    ReqFree,
    Reset,
    Scatter,
    Share,
    Split,
    Touch,
    Truncate,
    Unlock,
    decode_event,
    encode_event,
    mamba,
    swa,
)
from kvstate.events.codec import CODEC, upcaster
from kvstate.log import (
    FORMAT_VERSION,
    MAGIC,
    Checkpoint,
    EndRecord,
    LogFormatError,
    LogReader,
    LogWriter,
    Recorder,
    make_header,
    read_events,
    write_log,
)
from kvstate.log.format import FRAME, PREAMBLE_SIZE, frame, new_packer
from kvstate.replay import replay

REPO = Path(__file__).resolve().parent.parent

ONE_OF_EACH: list[Event] = [
    ReqAlloc((1, "named")), ReqFree((2,)), Allocate((3, 4)), Allocate((5,), ((1, (5, 6)),)),
    Append(((1, 2), ("named", 0))), Assign(1, 0, (7, 8)), Scatter(((1, 3, 9), (2, 0, 4))),
    Truncate("named", 3), Free((3,), True), FreeMapped((4,), False),
    Share(2, 4, (9,)), Copy((1, 2), (3, 4)), Insert(0, (10, 11), (12, 13), 1, 5, "named"),
    Split(1, 1, 2, 6), Touch((0, 1, 2), 7), Lock(2), Unlock(2), Evict((1, 2), True),
    Reset("tree"), BlockAlloc("r", (1, 2)), BlockHold("r", (0, 3)),
    BlockRelease("r", (1, 2), False, True),
    BlockCache(0, ((1, (1, 2, 3, 4), None, 5), (2, (5, 6, 7, 8), (("lora", "a", -1),), 0)), 1),
    BlockUncache((5,), (1,)), BlockClear(), Offload(3, (0, 1)), Load(3, (7, 8), 9),
    HostFree((3,), True),
]
ONE_OF_EACH += [  # the SWA pool's events (kvstate.events.swa)
    swa.SwaAlloc(((3, 1),)), swa.SwaFree((3,), True), swa.SwaEvict((1,), False),
    swa.SwaPublish(1, 8), swa.SwaTouch((2, 1), 9), swa.SwaLock(2, 1, 1), swa.SwaUnlock(2, 1),
    swa.SwaAdopt(1, (5,), "named", 10, True), swa.SwaRebind(1, (6,), 11),
]
ONE_OF_EACH += [  # the Mamba state pool's events (kvstate.events.mamba)
    mamba.MambaAlloc((1, 2)), mamba.MambaBind("named", (1,)), mamba.MambaFree((2,)),
    mamba.MambaDonate(3, 0, 4), mamba.MambaCopy(1, 5), mamba.MambaCommit(2, 5, 12),
    mamba.MambaTouch(2, 13), mamba.MambaLock(2), mamba.MambaUnlock(2), mamba.MambaEvict((2,)),
]


def test_every_event_type_round_trips_through_a_record():
    assert set(EVENT_TYPES.values()) <= {type(e) for e in ONE_OF_EACH}
    for evt in ONE_OF_EACH:
        body = encode_event(evt)  # what the writer and the recorder encode with
        decoded = decode_event(body)
        assert decoded == evt
        assert type(decoded) is type(evt)
        assert hash(decoded) == hash(evt)


def test_log_round_trip_keeps_events_checkpoints_and_end(tmp_path):
    geometry, events = planner_workload(requests=12, seed=2, page_size=4)
    path = tmp_path / "run.kvlog"
    final = write_log(path, geometry, events, checkpoint_every=50, meta={"k": [1, 2]})
    assert final == apply_all(initial_state(geometry), events)
    with LogReader(path) as reader:
        assert reader.header.geometry == geometry
        assert reader.header.meta == {"k": (1, 2)}
        assert reader.header.checkpoint_every == 50
        assert reader.header.format_version == FORMAT_VERSION
        assert reader.header.initial_fingerprint == initial_state(geometry).fingerprint()
        items = [item for _, item in reader.records()]
        assert reader.digests == "verified"
        assert reader.digests_verified == len(events) // 50 + 1
    got = [i for i in items if isinstance(i, Event)]
    checkpoints = [i for i in items if isinstance(i, Checkpoint)]
    assert got == events
    assert [c.seq for c in checkpoints] == list(range(50, len(events) + 1, 50))
    state = initial_state(geometry)
    for c in checkpoints:
        assert apply_all(state, events[: c.seq]).fingerprint() == c.fingerprint
    end = items[-1]
    assert isinstance(end, EndRecord)
    assert (end.count, end.fingerprint) == (len(events), final.fingerprint())


def test_file_starts_with_magic_and_version(tmp_path):
    path = tmp_path / "x.kvlog"
    write_log(path, Geometry(num_pages=4), [])
    data = path.read_bytes()
    assert data[:8] == MAGIC
    assert int.from_bytes(data[8:10], "little") == FORMAT_VERSION


def test_record_offsets_point_at_frames(tmp_path):
    path = tmp_path / "x.kvlog"
    write_log(path, Geometry(num_pages=8), [Allocate((1, 2)), Free((1,)), Free((2,))],
              checkpoint_every=2)
    data = path.read_bytes()
    with LogReader(path) as reader:
        offsets = [offset for offset, _ in reader.records()]
    assert offsets[0] > PREAMBLE_SIZE
    for offset in offsets:
        length = int.from_bytes(data[offset: offset + 4], "little")
        body = data[offset + 8: offset + 8 + length]
        assert frame(body) == data[offset: offset + 8 + length]
    assert offsets[-1] + 8 + int.from_bytes(data[offsets[-1]: offsets[-1] + 4], "little") == len(data)


def test_reader_streams_from_a_file_object_with_tiny_chunks(tmp_path):
    path = tmp_path / "x.kvlog"
    events = [Allocate((1, 2, 3)), Free((3, 1)), Free((2,), True)]
    write_log(path, Geometry(num_pages=8), events, checkpoint_every=1)
    reader = LogReader(io.BytesIO(path.read_bytes()), chunk_bytes=3)
    assert list(reader.events()) == events
    assert reader.end is not None and reader.end.count == 3


# -- the recorder -----------------------------------------------------------------------
def _sglang_objects(engine: Engine | None = None):
    from kvstate.sglang import RadixCache, ReqToTokenPool, TokenToKVPoolAllocator

    engine = engine or Engine(Geometry(num_pages=1))
    pool = ReqToTokenPool(size=4, max_context_len=32, engine=engine)
    allocator = TokenToKVPoolAllocator(size=64, engine=engine)
    return pool, allocator, RadixCache(pool, allocator, page_size=1)


def test_recorder_attaches_to_a_front_end_object_and_matches_the_engine(tmp_path):
    engine = Engine(Geometry(num_pages=1))
    path = tmp_path / "sg.kvlog"
    with Recorder(engine, path, checkpoint_every=3) as recorder:
        # The pool and allocator size the engine after the recorder is attached.
        pool, allocator, cache = _sglang_objects(engine)
        cache.insert([1, 2, 3, 4])
        cache.match_prefix([1, 2, 9])
        rows = pool.alloc(1)
        pool.free(rows)
    header, events = read_events(path)
    assert header.geometry == engine.geometry
    assert events == list(engine.events)
    assert recorder.count == len(events)
    result = replay(LogReader(path))
    assert result.ok, result.failure
    assert result.summary.checkpoints_verified == len(events) // 3
    assert result.state == engine.state


def test_recorder_accepts_any_object_with_an_engine(tmp_path):
    pool, allocator, cache = _sglang_objects()
    with Recorder(cache, tmp_path / "a.kvlog") as recorder:
        cache.insert([5, 6])
    assert recorder.engine is cache.engine
    assert read_events(tmp_path / "a.kvlog")[1] == list(cache.engine.events)
    with pytest.raises(TypeError, match="front end"):
        Recorder(object(), tmp_path / "b.kvlog")


def test_recorder_attached_late_writes_the_history_first(tmp_path):
    pool, allocator, cache = _sglang_objects()
    cache.insert([1, 2, 3])
    before = len(cache.engine.events)
    with Recorder(pool, tmp_path / "late.kvlog", checkpoint_every=2):
        cache.insert([1, 2, 4])
    events = read_events(tmp_path / "late.kvlog")[1]
    assert len(events) > before
    assert events == list(cache.engine.events)


def test_recorder_refuses_an_engine_that_forgot_its_events(tmp_path):
    engine = Engine(Geometry(num_pages=8), keep_events=False)
    engine.apply(Allocate((1,)))
    with pytest.raises(ValueError, match="did not keep"):
        Recorder(engine, tmp_path / "x.kvlog")


def test_recorder_flush_policy_and_fsync_on_close(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    engine = Engine(Geometry(num_pages=64))
    path = tmp_path / "f.kvlog"
    recorder = Recorder(engine, path, checkpoint_every=0, flush_bytes=1 << 20)
    engine.apply(Allocate((1,)))
    size_after_header = path.stat().st_size
    for page in range(2, 40):
        engine.apply(Allocate((page,)))
    assert path.stat().st_size == size_after_header  # buffered: nothing flushed yet
    recorder.flush()
    assert path.stat().st_size > size_after_header
    assert synced == []
    recorder.close()
    assert len(synced) == 1
    events = read_events(path)[1]
    assert len(events) == 39
    engine.apply(Allocate((50,)))  # detached: no longer recorded
    assert len(read_events(path)[1]) == 39


def _flushing_recorder(tmp_path: Path, block_events: int) -> tuple[Engine, Path, Recorder]:
    """An engine recorded with every sealed block handed to the OS at once."""
    engine = Engine(Geometry(num_pages=64))
    path = tmp_path / f"blocks_of_{block_events}.kvlog"
    recorder = Recorder(engine, path, checkpoint_every=0, flush_bytes=1, block_events=block_events)
    return engine, path, recorder


def test_recorder_small_blocks_and_flush_bytes_flush_as_it_goes(tmp_path):
    engine, path, recorder = _flushing_recorder(tmp_path, 1)
    engine.apply(Allocate((1,)))
    first = path.stat().st_size
    engine.apply(Allocate((2,)))
    assert path.stat().st_size > first
    recorder.close()
    assert read_events(path)[1] == [Allocate((1,)), Allocate((2,))]


def test_recorder_holds_events_until_its_block_is_sealed(tmp_path):
    engine, path, recorder = _flushing_recorder(tmp_path, 3)
    engine.apply(Allocate((1,)))
    header_only = path.stat().st_size
    engine.apply(Allocate((2,)))
    assert path.stat().st_size == header_only and recorder.writer.pending == [
        Allocate((1,)), Allocate((2,))]
    with engine.batch() as batch:  # a block ends at a batch boundary, never inside a batch
        batch.emit(Allocate((3,)))
        batch.emit(Allocate((4,)))
    assert path.stat().st_size > header_only and recorder.writer.pending == []
    recorder.flush()  # nothing pending: no empty block
    engine.apply(Allocate((5,)))
    recorder.flush()  # seals the pending event
    recorder.close()
    with LogReader(path) as reader:
        offsets = [offset for offset, item in reader.records() if isinstance(item, Event)]
    assert len(offsets) == 5 and len(set(offsets)) == 2
    with pytest.raises(ValueError, match="block_events"):
        Recorder(engine, tmp_path / "x.kvlog", block_events=0)


def test_writer_close_without_end_reads_as_truncated(tmp_path):
    path = tmp_path / "t.kvlog"
    writer = LogWriter(path, make_header(Geometry(num_pages=4)))
    writer.write_event(Allocate((1,)))
    writer.abandon()
    with pytest.raises(LogFormatError, match="without an end record"):
        read_events(path)
    header, events = read_events(path, salvage=True)
    assert events == [Allocate((1,))]


def test_recorded_synthetic_run_replays_to_the_live_fingerprint(tmp_path):
    from kvstate.workloads.synthetic import WorkloadSpec, run_synthetic

    spec = WorkloadSpec(requests=20, seed=9, page_size=1, capacity=400, max_running=4)
    path = tmp_path / "syn.kvlog"
    recorders = []
    run = run_synthetic(spec, attach=lambda r: recorders.append(
        Recorder(r.engine, path, checkpoint_every=64)))
    recorders[0].close()
    result = replay(LogReader(path))
    assert result.ok, result.failure
    assert result.summary.final_fingerprint == run.engine.state.fingerprint().hex()
    assert result.summary.requests == 20
    assert result.summary.evictions > 0
    assert result.summary.prefix_hit_tokens > 0


def test_synthetic_workload_is_deterministic():
    from kvstate.workloads.synthetic import WorkloadSpec, build_frontend, run_synthetic

    spec = WorkloadSpec(requests=10, seed=4, page_size=4, capacity=512, max_running=3)
    assert list(run_synthetic(spec).engine.events) == list(run_synthetic(spec).engine.events)
    other = WorkloadSpec(requests=10, seed=5, page_size=4, capacity=512, max_running=3)
    assert list(run_synthetic(other).engine.events) != list(run_synthetic(spec).engine.events)
    assert build_frontend(spec).engine.geometry == spec.geometry


# -- upcasters ----------------------------------------------------------------------------
def test_upcaster_chain_brings_an_old_record_to_the_current_version():
    from kvstate.events.codec import _upcast

    registry: dict = {}

    @upcaster("fr", -1, registry)
    def _v_minus_1(fields):
        (pages,) = fields
        return (pages,)

    @upcaster("fr", 0, registry)
    def _v0(fields):  # version 0 had no at_head field: it freed at the tail
        return (*fields, False)

    assert _upcast("fr", -1, ((3, 4),), 1, registry) == ((3, 4), False)
    body = new_packer().pack(("fr", 0, (3, 4)))
    assert CODEC.decode(body, registry) == Free((3, 4), False)
    with pytest.raises(EventDecodeError, match="no upcaster"):
        _upcast("ev", 0, ((1,),), 1, registry)
    with pytest.raises(EventDecodeError, match="no upcaster"):
        CODEC.decode(new_packer().pack(("ev", 0, (1,))), registry)
    with pytest.raises(ValueError, match="already registered"):
        upcaster("fr", 0, registry)(_v0)


# -- golden: committed logs keep decoding, and encode to the same bytes ------------------
GOLDEN = sorted((REPO / "replay" / "seed").glob("*.kvlog")) + sorted(
    (REPO / "replay" / "synthetic").glob("*.kvlog"))
FORMAT3 = sorted((REPO / "replay" / "format3").glob("*.kvlog"))


def _event_frames(log: Path) -> list[bytes]:
    """Every event record's or event block's frame, byte for byte (framing records left out)."""
    data = log.read_bytes()
    with LogReader(log) as reader:
        offsets = sorted({offset for offset, item in reader.records() if isinstance(item, Event)})
    return [data[o: o + FRAME.size + FRAME.unpack_from(data, o)[0]] for o in offsets]


@pytest.mark.parametrize("path", GOLDEN, ids=[p.name for p in GOLDEN])
def test_golden_log_records_reencode_byte_for_byte(path, tmp_path):
    header, events = read_events(path)
    assert header.format_version <= FORMAT_VERSION
    # Single-event records (formats 1 and 2) are the same bytes in every format version.
    assert _event_frames(path) == [frame(encode_event(event)) for event in events]
    copy = tmp_path / "copy.kvlog"
    write_log(copy, header.geometry, events, checkpoint_every=header.checkpoint_every,
              meta=header.meta)
    # The copy is written in event blocks, with digests in its framing records; it must read
    # back the same events and replay to the same checkpoints.
    assert read_events(copy)[1] == events
    with LogReader(path) as old, LogReader(copy) as new:
        old_marks = [(i.seq, i.fingerprint) for _, i in old.records() if isinstance(i, Checkpoint)]
        new_marks = [(i.seq, i.fingerprint) for _, i in new.records() if isinstance(i, Checkpoint)]
        assert old_marks == new_marks
        assert (old.end.count, old.end.fingerprint) == (new.end.count, new.end.fingerprint)
        assert new.digests == "verified" and old.digests == "unverified"


@pytest.mark.parametrize("path", FORMAT3, ids=[p.name for p in FORMAT3])
def test_format_3_golden_logs_rewrite_byte_for_byte(path, tmp_path):
    """Event blocks are stable bytes: rewriting a committed format 3 log's events with its
    header's settings reproduces every block frame."""
    header, events = read_events(path)
    assert header.format_version == 3
    copy = tmp_path / "copy.kvlog"
    write_log(copy, header.geometry, events, checkpoint_every=header.checkpoint_every,
              meta=header.meta)
    assert _event_frames(copy) == _event_frames(path)
    assert len(_event_frames(path)) < len(events)  # several events share a block


# -- hypothesis: any field values of the right types round-trip exactly --------------------
def test_hypothesis_events_round_trip_through_a_log(tmp_path):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=40)
    @given(st.lists(event_strategy(), max_size=12))
    def check_round_trip(events):
        path = tmp_path / "h.kvlog"
        writer = LogWriter(path, make_header(Geometry(num_pages=4)), fsync=False)
        writer.write_events(events)
        writer.close(b"\x01" * 16)
        assert read_events(path)[1] == events

    check_round_trip()
