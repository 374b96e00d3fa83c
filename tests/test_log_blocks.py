"""Event blocks (format 3): many events in one frame, one CRC and one C decode for them all.

A block body is ``["#b", 1, [[tag, *fields], ...]]``; each event is at the version the
header's ``event_versions`` gives its tag.  These tests write blocks, read them back, and
attack them: blocks in older formats, bad versions, absurd counts, a bad event inside, an
older event version with and without an upcaster, blocks past the record limit, and a
recorder whose sealing fails.
"""

from __future__ import annotations

import io
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from log_helpers import planner_workload

import kvstate.log.writer as writer_module
from kvstate import Engine, Geometry
from kvstate.errors import ListenerError
from kvstate.events import Allocate, Event, Free
from kvstate.events.codec import CODEC, upcaster
from kvstate.log import (
    LogFormatError,
    LogReader,
    LogWriter,
    Recorder,
    make_header,
    read_events,
    verify_log,
    write_log,
)
from kvstate.log.format import (
    BLOCK_PREFIX,
    FRAME,
    MAX_BLOCK_EVENTS,
    PREAMBLE_SIZE,
    frame,
    new_packer,
    preamble,
)

REPO = Path(__file__).resolve().parent.parent
FORMAT_2 = REPO / "replay" / "format2" / "000_radix_example.kvlog"
GEOMETRY = Geometry(num_pages=64)
EVENTS = [Allocate((page,)) for page in range(1, 11)] + [Free((3, 1)), Free((5,), True)]


def _frames(data: bytes) -> list[tuple[int, bytes]]:
    """(offset, body) of every frame after the header."""
    out = []
    length, _ = FRAME.unpack_from(data, PREAMBLE_SIZE)
    offset = PREAMBLE_SIZE + FRAME.size + length
    while offset < len(data):
        length, _ = FRAME.unpack_from(data, offset)
        out.append((offset, data[offset + FRAME.size: offset + FRAME.size + length]))
        offset += FRAME.size + length
    return out


def _block(events: list[Event]) -> bytes:
    body = bytearray(BLOCK_PREFIX)
    CODEC.encode_plain_list(events, body)
    return bytes(body)


def _log(tmp_path: Path, events: list[Event] = EVENTS, **options: int) -> bytes:
    path = tmp_path / "blocks.kvlog"
    writer = LogWriter(path, make_header(GEOMETRY, checkpoint_every=0), fsync=False, **options)
    writer.write_events(events)
    writer.close(_fingerprint_after(events))
    return path.read_bytes()


def _fingerprint_after(events: list[Event]) -> bytes:
    engine = Engine(GEOMETRY)
    for event in events:
        engine.apply(event)
    return engine.state.fingerprint()


def _error(data: bytes, **options: object) -> LogFormatError:
    with pytest.raises(LogFormatError) as info:
        list(LogReader(io.BytesIO(data), **options).records())  # type: ignore[arg-type]
    return info.value


def _replaced(data: bytes, offset: int, body: bytes) -> bytes:
    length, _ = FRAME.unpack_from(data, offset)
    return data[:offset] + frame(body) + data[offset + FRAME.size + length:]


def test_blocks_hold_up_to_block_events_events_and_read_back_in_order(tmp_path):
    data = _log(tmp_path, block_events=5)
    frames = _frames(data)
    assert [body[:5] for _, body in frames[:-1]] == [BLOCK_PREFIX] * 3  # 5 + 5 + 2, then the end
    reader = LogReader(io.BytesIO(data))
    located = list(reader.records())
    assert [item for _, item in located[:-1]] == EVENTS
    assert [offset for offset, _ in located[:-1]] == [frames[0][0]] * 5 + [frames[1][0]] * 5 + \
        [frames[2][0]] * 2
    assert reader.events_read == len(EVENTS) and reader.records_read == 4
    found = verify_log(tmp_path / "blocks.kvlog")
    assert (found.events, found.records, found.digests) == (len(EVENTS), 4, "verified")


def test_a_block_in_a_format_2_log_is_refused(tmp_path):
    data = FORMAT_2.read_bytes()
    offset, _ = _frames(data)[0]
    forged = _replaced(data, offset, _block([Allocate((1,))]))
    assert "blocks exist from format 3" in _error(forged).reason
    path = tmp_path / "forged.kvlog"
    path.write_bytes(forged)
    with pytest.raises(LogFormatError, match="blocks exist from format 3"):
        verify_log(path)


@pytest.mark.parametrize(("body", "reason"), [
    (b"\x93\xa2#b\x02\x91\x92\xa2fr\x91\x01", "event block version 02 is not 1"),
    (BLOCK_PREFIX + b"\x90", "with 1 to 65536 events"),
    (BLOCK_PREFIX + b"\xdd" + (MAX_BLOCK_EVENTS + 1).to_bytes(4, "big"), "with 1 to 65536 events"),
    (BLOCK_PREFIX + b"\xdd\xff\xff\xff\xff", "with 1 to 65536 events"),
    (BLOCK_PREFIX + b"\x01", "with 1 to 65536 events"),
    (BLOCK_PREFIX, "with 1 to 65536 events"),
])
def test_malformed_blocks_are_refused_before_decoding(tmp_path, body, reason):
    data = _log(tmp_path)
    offset, _ = _frames(data)[0]
    forged = _replaced(data, offset, body)
    err = _error(forged)
    assert err.offset == offset and reason in err.reason, err.reason
    path = tmp_path / "forged.kvlog"
    path.write_bytes(forged)
    if body[4:5] == b"\x01":  # verify reads the count from the bytes alone
        with pytest.raises(LogFormatError, match="1 to 65536 events"):
            verify_log(path)


def test_a_bad_event_in_a_block_names_the_item_and_salvage_keeps_the_blocks_before(tmp_path):
    data = _log(tmp_path, block_events=4)
    frames = _frames(data)
    bad = msgpack.packb([["al", [1, 2], []], ["fr", [True], False]])  # a bool page id
    forged = _replaced(data, frames[1][0], BLOCK_PREFIX + bad)
    err = _error(forged)
    assert err.offset == frames[1][0]
    assert "event block: item 1" in err.reason and "Free.pages" in err.reason, err.reason
    reader = LogReader(io.BytesIO(forged), salvage=True)
    assert list(reader.events()) == EVENTS[:4]
    assert reader.stopped is not None and reader.stopped.offset == frames[1][0]


def _with_versions(data: bytes, versions: dict[str, int]) -> bytes:
    """``data`` with its header's event_versions replaced (the header frame re-framed)."""
    length, _ = FRAME.unpack_from(data, PREAMBLE_SIZE)
    header = msgpack.unpackb(data[PREAMBLE_SIZE + FRAME.size: PREAMBLE_SIZE + FRAME.size + length])
    header["event_versions"] = versions
    return data[:PREAMBLE_SIZE] + frame(new_packer().pack(header)) + \
        data[PREAMBLE_SIZE + FRAME.size + length:]


def test_an_older_event_version_goes_through_its_upcaster(tmp_path):
    data = _log(tmp_path)
    versions = dict(CODEC.versions, fr=0)  # the header says Free was written at version 0
    older = _with_versions(data, versions)
    err = _error(older)
    assert "no upcaster from event 'fr' version 0" in err.reason
    registry: dict = {}

    @upcaster("fr", 0, registry)
    def _free_v0(fields):  # version 0 listed the pages in reverse
        pages, at_head = fields
        return (list(reversed(pages)), at_head)

    reader = LogReader(io.BytesIO(older), upcasters=registry)
    events = list(reader.events())
    assert events[:10] == EVENTS[:10]
    assert events[10:] == [Free((1, 3)), Free((5,), True)]
    assert reader.digests == "broken"  # the header bytes changed


def test_a_tag_the_header_gives_no_version_is_refused(tmp_path):
    data = _log(tmp_path)
    versions = {tag: version for tag, version in CODEC.versions.items() if tag != "al"}
    err = _error(_with_versions(data, versions))
    assert "item 0" in err.reason and "no version for event tag 'al'" in err.reason


@pytest.mark.parametrize("value", [True, -1, 1 << 16, "1", 1.0])
def test_a_format_3_header_refuses_a_version_that_is_not_one(tmp_path, value):
    err = _error(_with_versions(_log(tmp_path), dict(CODEC.versions, al=value)))
    assert err.offset == PREAMBLE_SIZE and "event_versions maps 'al'" in err.reason


def test_a_block_over_the_record_limit_is_split(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_module, "MAX_RECORD_BYTES", 40)
    data = _log(tmp_path)
    bodies = [body for _, body in _frames(data)[:-1]]
    assert len(bodies) > 1 and all(len(body) <= 40 for body in bodies)
    assert read_events(tmp_path / "blocks.kvlog")[1] == EVENTS
    single = [Allocate(tuple(range(1, 40)))]  # one event alone over the limit: refused,
    with pytest.raises(ValueError, match="over the 40-byte record limit"):  # no unreadable log
        _log(tmp_path, single)


def test_a_recorder_whose_sealing_fails_stops_and_keeps_the_blocks_before(tmp_path, monkeypatch):
    engine = Engine(GEOMETRY)
    path = tmp_path / "failing.kvlog"
    recorder = Recorder(engine, path, checkpoint_every=0, block_events=3)
    for page in range(1, 4):  # the third event seals the first block
        engine.apply(Allocate((page,)))
    calls = []

    def broken(events, out):
        calls.append(len(events))
        raise OverflowError("cannot encode")

    monkeypatch.setattr(CODEC, "encode_plain_list", broken)
    engine.apply(Allocate((4,)))
    engine.apply(Allocate((5,)))
    with pytest.raises(ListenerError) as info:
        engine.apply(Allocate((6,)))
    assert isinstance(info.value.error, OverflowError) and recorder.failed is info.value.error
    assert engine.seq == 6  # the events stay applied; the recorder is detached
    recorder.close()
    monkeypatch.undo()
    header, events = read_events(path, salvage=True)
    assert events == [Allocate((1,)), Allocate((2,)), Allocate((3,))]
    # The failed block, close's last try, then the first event alone: nothing encodes, so
    # the log ends with the first block.
    assert calls == [3, 3, 1]


def test_block_events_must_be_a_sane_int(tmp_path):
    header = make_header(GEOMETRY)
    for bad in (0, -1, True, 1.5, MAX_BLOCK_EVENTS + 1, "8"):
        with pytest.raises(ValueError, match="block_events"):
            LogWriter(tmp_path / "x.kvlog", header, block_events=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="block_events"):
            Recorder(Engine(GEOMETRY), tmp_path / "y.kvlog", block_events=bad)  # type: ignore[arg-type]


def test_a_recorded_workload_replays_from_blocks_to_the_same_checkpoints(tmp_path):
    geometry, events = planner_workload(requests=16, seed=5, page_size=2, capacity=256)
    path = tmp_path / "run.kvlog"
    write_log(path, geometry, events, checkpoint_every=50)
    with LogReader(path) as reader:
        located = list(reader.records())
    assert [item for _, item in located if isinstance(item, Event)] == events
    frames = _frames(path.read_bytes())
    assert len(frames) < len(events) // 10  # blocks between the checkpoints
    found = verify_log(path)
    assert found.events == len(events) and found.digests == "verified"


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow,
                                                   HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200))
def test_any_bytes_in_a_block_are_events_or_a_format_error(tmp_path, tail):
    data = _log(tmp_path)
    offset, _ = _frames(data)[0]
    forged = _replaced(data, offset, BLOCK_PREFIX + tail)
    try:
        list(LogReader(io.BytesIO(forged)).records())
    except LogFormatError as err:
        assert offset <= err.offset <= len(forged)
    path = tmp_path / "fuzzed.kvlog"
    path.write_bytes(forged)
    try:
        verify_log(path)
    except LogFormatError:
        pass


def test_the_preamble_names_format_3():
    assert preamble(make_header(GEOMETRY))[8:10] == (3).to_bytes(2, "little")
