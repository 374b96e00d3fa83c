"""The log format: round trips, framing, checkpoints, the recorder, upcasters, golden bytes."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from kvstate import Engine, Geometry, apply_all, initial_state
from kvstate.events import (
    Allocate,
    Append,
    Assign,
    Copy,
    Event,
    Evict,
    Free,
    Insert,
    Lock,
    ReqAlloc,
    ReqFree,
    Reset,
    Share,
    Split,
    Touch,
    Truncate,
    Unlock,
)
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
    replay,
    write_log,
)
from kvstate.log.decode import decode_record
from kvstate.log.format import PREAMBLE_SIZE, frame, new_packer, unpack_body
from kvstate.log.synthetic import WorkloadSpec, build_frontend, run_synthetic
from kvstate.log.upcast import UpcastError, upcast, upcaster
from kvstate.sglang import RadixCache, ReqToTokenPool, TokenToKVPoolAllocator

REPO = Path(__file__).resolve().parent.parent

ONE_OF_EACH: list[Event] = [
    ReqAlloc((1, "named")), ReqFree((2,)), Allocate((3, 4)), Allocate((5,), ((1, (5, 6)),)),
    Append(((1, 2), ("named", 0))), Assign(1, 0, (7, 8)), Truncate("named", 3), Free((3,), True),
    Share(2, 4, (9,)), Copy((1, 2), (3, 4)), Insert(0, (10, 11), (12, 13), 1, 5, "named"),
    Split(1, 1, 2, 6), Touch((0, 1, 2), 7), Lock(2), Unlock(2), Evict((1, 2), True),
    Reset("tree"),
]


def test_every_event_type_round_trips_through_a_record():
    packer = new_packer()
    from kvstate.events import EVENT_TYPES
    from kvstate.log.format import make_encoders

    encoders = make_encoders(packer.pack)  # what the writer and the recorder encode with

    core = {cls for cls in EVENT_TYPES.values() if cls.__module__ == "kvstate.events"}
    assert core <= {type(e) for e in ONE_OF_EACH}
    for evt in ONE_OF_EACH:
        body = encoders[type(evt)](evt)
        decoded = decode_record(unpack_body(body, 0), 0)
        assert decoded == evt
        assert type(decoded) is type(evt)
        assert hash(decoded) == hash(evt)


def test_log_round_trip_keeps_events_checkpoints_and_end(tmp_path):
    spec = WorkloadSpec(requests=12, seed=2, page_size=4, capacity=512, max_running=3)
    run = run_synthetic(spec)
    events = list(run.engine.events)
    path = tmp_path / "run.kvlog"
    final = write_log(path, spec.geometry, events, checkpoint_every=50, meta={"k": [1, 2]})
    assert final == run.engine.state
    with LogReader(path) as reader:
        assert reader.header.geometry == spec.geometry
        assert reader.header.meta == {"k": (1, 2)}
        assert reader.header.checkpoint_every == 50
        assert reader.header.format_version == FORMAT_VERSION
        assert reader.header.initial_fingerprint == initial_state(spec.geometry).fingerprint()
        items = [item for _, item in reader.records()]
    got = [i for i in items if isinstance(i, Event)]
    checkpoints = [i for i in items if isinstance(i, Checkpoint)]
    assert got == events
    assert [c.seq for c in checkpoints] == list(range(50, len(events) + 1, 50))
    state = initial_state(spec.geometry)
    for c in checkpoints:
        assert apply_all(state, events[: c.seq]).fingerprint() == c.fingerprint
    assert items[-1] == EndRecord(len(events), final.fingerprint())


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


def test_recorder_small_flush_bytes_flushes_as_it_goes(tmp_path):
    engine = Engine(Geometry(num_pages=64))
    path = tmp_path / "f.kvlog"
    recorder = Recorder(engine, path, checkpoint_every=0, flush_bytes=1)
    engine.apply(Allocate((1,)))
    first = path.stat().st_size
    engine.apply(Allocate((2,)))
    assert path.stat().st_size > first
    recorder.close()


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
    spec = WorkloadSpec(requests=10, seed=4, page_size=4, capacity=512, max_running=3)
    assert list(run_synthetic(spec).engine.events) == list(run_synthetic(spec).engine.events)
    other = WorkloadSpec(requests=10, seed=5, page_size=4, capacity=512, max_running=3)
    assert list(run_synthetic(other).engine.events) != list(run_synthetic(spec).engine.events)
    assert build_frontend(spec).engine.geometry == spec.geometry


# -- upcasters ----------------------------------------------------------------------------
def test_upcaster_chain_brings_an_old_record_to_the_current_version():
    registry: dict = {}

    @upcaster("fr", -1, registry)
    def _v_minus_1(fields):
        (pages,) = fields
        return (pages,)

    @upcaster("fr", 0, registry)
    def _v0(fields):  # version 0 had no at_head field: it freed at the tail
        return (*fields, False)

    assert upcast("fr", -1, ((3, 4),), 1, registry) == ((3, 4), False)
    body = new_packer().pack(("fr", 0, (3, 4)))
    assert decode_record(unpack_body(body, 0), 0, registry) == Free((3, 4), False)
    with pytest.raises(UpcastError, match="no upcaster"):
        upcast("ev", 0, ((1,),), 1, registry)
    with pytest.raises(LogFormatError, match="no upcaster"):
        decode_record(unpack_body(new_packer().pack(("ev", 0, (1,))), 0), 17)
    with pytest.raises(ValueError, match="already registered"):
        upcaster("fr", 0, registry)(_v0)


# -- golden: committed logs keep decoding, and encode to the same bytes ------------------
GOLDEN = sorted((REPO / "replay" / "seed").glob("*.kvlog")) + sorted(
    (REPO / "replay" / "synthetic").glob("*.kvlog"))


@pytest.mark.parametrize("path", GOLDEN, ids=[p.name for p in GOLDEN])
def test_golden_log_records_reencode_byte_for_byte(path, tmp_path):
    header, events = read_events(path)
    assert header.format_version <= FORMAT_VERSION
    copy = tmp_path / "copy.kvlog"
    write_log(copy, header.geometry, events, checkpoint_every=header.checkpoint_every,
              meta=header.meta)
    def records_section(log: Path) -> bytes:
        with LogReader(log) as reader:
            first_record = next(reader.records())[0]
        return log.read_bytes()[first_record:]

    assert records_section(copy) == records_section(path)


# -- hypothesis: any field values of the right types round-trip exactly --------------------
def _field_strategies():
    from hypothesis import strategies as st

    from kvstate.log import decode as dec

    integer = st.integers(-(2**63), 2**64 - 1)
    rid = st.one_of(integer, st.text(max_size=6))
    ints = st.lists(integer, max_size=6).map(tuple)
    by_validator = {
        dec._is_int: integer, dec._is_bool: st.booleans(), dec._is_rid: rid, dec._is_ints: ints,
        dec._is_rids: st.lists(rid, max_size=4).map(tuple),
        dec._is_slot_items: st.lists(st.tuples(rid, ints), max_size=3).map(tuple),
        dec._is_commit_items: st.lists(st.tuples(rid, integer), max_size=3).map(tuple),
    }
    strategies = []
    for schema in dec.SCHEMAS.values():
        if schema.fast and schema.cls.__module__ == "kvstate.events":
            fields = [by_validator[v] for v in schema.validators]
            strategies.append(st.tuples(*fields).map(lambda values, cls=schema.cls: cls(*values)))
    return st.one_of(strategies)


def test_hypothesis_events_round_trip_through_a_log(tmp_path):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=40)
    @given(st.lists(_field_strategies(), max_size=12))
    def check_round_trip(events):
        path = tmp_path / "h.kvlog"
        writer = LogWriter(path, make_header(Geometry(num_pages=4)), fsync=False)
        writer.write_events(events)
        writer.close(b"\x01" * 16)
        assert read_events(path)[1] == events

    check_round_trip()
