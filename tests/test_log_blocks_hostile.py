"""Hostile cases for format 3 event blocks, from a review of their first version: each of the
first five tests failed on it because of the defect its docstring names."""

from __future__ import annotations

import io
from pathlib import Path

import msgpack
import pytest

from kvstate import Engine, Geometry
from kvstate.events import Allocate, Free
from kvstate.events.codec import CODEC, EventDecodeError
from kvstate.log import LogFormatError, LogReader, LogWriter, Recorder, make_header, read_events
from kvstate.log.format import BLOCK_PREFIX, MAX_BLOCK_EVENTS, Checkpoint

GEOMETRY = Geometry(num_pages=8)


def test_a_recorder_attached_after_more_than_max_block_events_writes_a_readable_log(tmp_path):
    """Defect: the history (or any pending list) is sealed as ONE block however many events
    it holds; over 65,536 the writer writes a block every reader and verify refuse."""
    engine = Engine(GEOMETRY)
    while engine.seq <= MAX_BLOCK_EVENTS:
        engine.apply(Allocate((1,)))
        engine.apply(Free((1,)))
    path = tmp_path / "late.kvlog"
    Recorder(engine, path, checkpoint_every=0, fsync=False).close()
    _, events = read_events(path)  # LogFormatError: "with 1 to 65536 events"
    assert len(events) == engine.seq


def test_flushing_a_recorder_does_not_suppress_its_checkpoints(tmp_path):
    """Defect: ``_seal_at`` is relative to ``writer.sealed``; an external flush() seals and
    empties ``pending`` without recomputing it, so checkpoints come late or never."""
    engine = Engine(GEOMETRY)
    path = tmp_path / "flushed.kvlog"
    recorder = Recorder(engine, path, checkpoint_every=10, fsync=False)
    for step in range(50):
        engine.apply(Allocate((1,)))
        engine.apply(Free((1,)))
        if step % 2 == 0:
            recorder.flush()  # the durability knob the docs point to
    recorder.close()
    with LogReader(path) as reader:
        seqs = [item.seq for _, item in reader.records() if isinstance(item, Checkpoint)]
    assert seqs == list(range(10, 101, 10))  # observed: []


def test_a_block_item_missing_a_defaulted_field_is_refused_like_a_single_record():
    """Defect: the typed list decoder accepts array-like items with trailing defaults left
    out (``["fr", [1]]``), which the single-record path and the block's own slow path refuse:
    whether the same block decodes depends on the header's versions of unrelated tags."""
    short = b"\x91" + msgpack.packb(["fr", [1]])
    with pytest.raises(EventDecodeError):
        CODEC.decode(msgpack.packb(["fr", CODEC.versions["fr"], [1]]))  # holds today
    with pytest.raises(EventDecodeError, match="fields"):
        CODEC.decode_plain_list(short, CODEC.versions)  # observed: [Free(pages=(1,))]


def test_a_block_item_missing_a_defaulted_field_is_a_format_error(tmp_path):
    """The same defect through the reader: the forged block replays as a valid log."""
    path = tmp_path / "short.kvlog"
    writer = LogWriter(path, make_header(GEOMETRY, checkpoint_every=0), fsync=False)
    writer._write_body(BLOCK_PREFIX + b"\x92" + msgpack.packb(["al", [1], []]) +
                       msgpack.packb(["fr", [1]]))
    engine = Engine(GEOMETRY)
    engine.apply(Allocate((1,)))
    engine.apply(Free((1,)))
    writer.sealed = 2
    writer.close(engine.state.fingerprint())
    with pytest.raises(LogFormatError, match="fields"):
        list(LogReader(io.BytesIO(Path(path).read_bytes())).events())


def test_close_keeps_the_sealed_blocks_when_sealing_the_rest_fails(tmp_path):
    """Defect: ``close`` seals pending events first; if that raises, ``finally`` closes the
    file without flushing, so blocks already sealed (still in the buffer) are lost too."""
    path = tmp_path / "bad.kvlog"
    writer = LogWriter(path, make_header(GEOMETRY, checkpoint_every=0), fsync=False,
                       block_events=4)
    good = [Allocate((1,)), Free((1,))] * 4
    writer.write_events(good)  # two blocks sealed, buffered (under flush_bytes)
    writer.write_event(Allocate((1 << 70,)))  # unencodable, accepted until the next seal
    with pytest.raises(OverflowError):
        writer.close(b"\0" * 16)
    reader = LogReader(path, salvage=True)
    assert list(reader.events()) == good  # observed: [] (the file holds only the header)


def test_abandon_keeps_the_events_before_the_first_that_cannot_be_encoded(tmp_path):
    path = tmp_path / "prefix.kvlog"
    writer = LogWriter(path, make_header(GEOMETRY, checkpoint_every=0), fsync=False)
    good = [Allocate((1,)), Free((1,)), Allocate((2,))]
    writer.write_events([*good, Allocate((1 << 70,)), Free((2,))])
    writer.abandon()
    reader = LogReader(path, salvage=True)
    assert list(reader.events()) == good and reader.stopped is not None
    with pytest.raises(ValueError, match="closed"):
        writer.write_event(Free((2,)))


def test_a_header_from_a_writer_with_fewer_event_types_keeps_the_fast_path():
    """An older format 3 writer knew fewer event types: its header lists fewer tags.  Its
    blocks decode in one typed call over the types it lists (no per-item slow path)."""
    events = [Allocate((1, 2)), Free((1,), True), Allocate((3,))]
    body = bytearray()
    CODEC.encode_plain_list(events, body)
    older = {tag: version for tag, version in CODEC.versions.items() if tag not in ("bh", "ba")}
    assert CODEC.decode_plain_list(bytes(body), older) == events
    key = tuple(sorted(older.items()))
    assert CODEC._list_decoders.get(key) is not None
    msgpack_free = b"\x91" + msgpack.packb(["bh", "r", [1]])  # a tag the header does not list
    with pytest.raises(EventDecodeError, match="no version for event tag 'bh'"):
        CODEC.decode_plain_list(msgpack_free, older)
