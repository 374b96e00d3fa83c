"""Malformed logs: every case is a ``LogFormatError`` with the byte offset; nothing else escapes."""

from __future__ import annotations

import io
import zlib

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstate import Geometry
from kvstate.events import Allocate, Append, Free, Insert, ReqAlloc, Touch
from kvstate.log import LogFormatError, LogReader, read_events, write_log
from kvstate.log.format import (
    FRAME,
    LENGTH,
    MAGIC,
    MAX_RECORD_BYTES,
    PREAMBLE_SIZE,
    frame,
    new_packer,
)

EVENTS = [Allocate((1, 2, 3)), ReqAlloc((1,)), Allocate((4,), ((1, (4,)),)), Append(((1, 1),)),
          Touch((0,), 1), Insert(0, (7, 8), (1, 2), 1, 2, 0), Free((3,))]


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("logs") / "good.kvlog"
    write_log(path, Geometry(num_pages=8, num_rows=2, row_width=16), EVENTS, checkpoint_every=2)
    return path.read_bytes()


def record_offsets(data: bytes) -> list[int]:
    """Start of every frame after the header (the header frame itself is at PREAMBLE_SIZE)."""
    offsets = []
    length, _ = FRAME.unpack_from(data, PREAMBLE_SIZE)
    offset = PREAMBLE_SIZE + FRAME.size + length
    while offset < len(data):
        offsets.append(offset)
        length, _ = FRAME.unpack_from(data, offset)
        offset += FRAME.size + length
    return offsets


def read_all(data: bytes, **options) -> list:
    reader = LogReader(io.BytesIO(data), **options)
    return [item for _, item in reader.records()]


def error_of(data: bytes, **options) -> LogFormatError:
    with pytest.raises(LogFormatError) as info:
        read_all(data, **options)
    return info.value


def with_record(good: bytes, index: int, body: bytes) -> bytes:
    """``good`` with record ``index`` replaced by a correctly framed ``body``."""
    offsets = record_offsets(good)
    start = offsets[index]
    length, _ = FRAME.unpack_from(good, start)
    return good[:start] + frame(body) + good[start + FRAME.size + length:]


def test_the_good_log_reads(good):
    reader = LogReader(io.BytesIO(good))
    assert list(reader.events()) == EVENTS
    assert reader.end is not None and reader.end.count == len(EVENTS)
    # Blocks of two events, each followed by a checkpoint; the seventh event's block, the end.
    assert len(record_offsets(good)) == (len(EVENTS) + 1) // 2 + len(EVENTS) // 2 + 1


def test_empty_file():
    err = error_of(b"")
    assert (err.offset, err.reason) == (0, "empty file")


def test_wrong_magic(good):
    err = error_of(b"PK\x03\x04" + good[4:])
    assert err.offset == 0 and "magic" in err.reason
    err = error_of(b"hello")
    assert err.offset == 0 and "magic" in err.reason


def test_future_format_version(good):
    err = error_of(good[:8] + (99).to_bytes(2, "little") + good[10:])
    assert err.offset == 8 and "newer" in err.reason


def test_format_version_zero_does_not_exist(good):
    err = error_of(good[:8] + (0).to_bytes(2, "little") + good[10:])
    assert err.offset == 8


@pytest.mark.parametrize("cut", [1, 7, 8, 9, 10, 11, 17, 18, 30])
def test_truncated_in_the_preamble_or_header(good, cut):
    err = error_of(good[:cut])
    assert err.offset <= cut
    assert "truncated" in err.reason or "magic" in err.reason


def test_truncated_anywhere_names_the_torn_record(good):
    offsets = record_offsets(good)
    for cut in range(offsets[0], len(good)):
        err = error_of(good[:cut])
        torn = max(o for o in offsets if o <= cut)
        assert err.offset == torn, (cut, err)
        assert "truncated" in err.reason or "without an end record" in err.reason
        # Salvage keeps every record before the torn one.
        reader = LogReader(io.BytesIO(good[:cut]), salvage=True)
        kept = list(reader.records())
        assert sorted({o for o, _ in kept}) == [o for o in offsets if o < torn]
        assert reader.stopped is not None and reader.stopped.offset == torn


def test_a_bit_flipped_anywhere_is_caught(good):
    offsets = record_offsets(good)
    for position in range(len(good)):
        for bit in (0, 5):
            data = bytearray(good)
            data[position] ^= 1 << bit
            err = error_of(bytes(data))
            if position >= offsets[0]:
                assert err.offset == max(o for o in offsets if o <= position), (position, err)
            else:
                assert err.offset <= PREAMBLE_SIZE, (position, err)


def test_unknown_tag(good):
    err = error_of(with_record(good, 1, new_packer().pack(("zz", 1, (1,)))))
    assert err.offset == record_offsets(good)[1] and "unknown record tag 'zz'" in err.reason


@pytest.mark.parametrize("body, fragment", [
    (("al", 1, (1,)), "has 2 fields, record has 1"),
    (("al", 1, (1,), (), 5), "has 2 fields, record has 3"),
    (("al", 1, ("x",), ()), "Allocate.pages has a bad value"),
    (("al", 1, (1.5,), ()), "Allocate.pages has a bad value"),
    (("al", 1, (1,), ((1, 2),)), "Allocate.items has a bad value"),
    (("fr", 1, (1,), 1), "Free.at_head has a bad value"),
    (("ra", 1, (None,)), "ReqAlloc.requests has a bad value"),
    (("rs", 1, "everything"), "bad fields for Reset"),
    (("al", "1", (1,), ()), "version is a str"),
    (("al", 2, (1,), ()), "newer than this kvstate"),
    (["al"], "not an array"),
    ({"tag": "al"}, "not an array"),
    (7, "not an array"),
])
def test_wrong_field_count_or_type(good, body, fragment):
    err = error_of(with_record(good, 0, new_packer().pack(body)))
    assert err.offset == record_offsets(good)[0]
    assert fragment in err.reason


def test_bad_checkpoint_and_end_records(good):
    offsets = record_offsets(good)
    checkpoint_index = 1  # after the block of the first two events
    zeros = b"\0" * 16
    err = error_of(with_record(good, checkpoint_index, new_packer().pack(("#c", 2, 5, zeros, zeros))))
    assert err.offset == offsets[checkpoint_index] and "checkpoint says 5 events" in err.reason
    err = error_of(with_record(good, checkpoint_index, new_packer().pack(("#c", 2, 2, b"\0", zeros))))
    assert "fingerprint is not 16 bytes" in err.reason
    err = error_of(with_record(good, checkpoint_index, new_packer().pack(("#c", 2, 2, zeros, b"\0"))))
    assert "digest is not 16 bytes" in err.reason
    # A format 3 log carries version 2 framing records only (no digest-less downgrade).
    err = error_of(with_record(good, checkpoint_index, new_packer().pack(("#c", 1, 2, zeros))))
    assert "in a format 3 log" in err.reason
    last = len(offsets) - 1
    err = error_of(with_record(good, last, new_packer().pack(("#e", 2, 99, zeros, zeros))))
    assert err.offset == offsets[last] and "end record says 99" in err.reason


def test_bytes_after_the_end_record(good):
    err = error_of(good + b"\0")
    assert err.offset == len(good) and "after the end record" in err.reason
    err = error_of(good + good)
    assert err.offset == len(good)


def test_oversized_length_is_refused_before_reading(good):
    start = record_offsets(good)[0]
    huge = MAX_RECORD_BYTES + 1
    data = good[:start] + FRAME.pack(huge, 0) + good[start + FRAME.size:]
    err = error_of(data)
    assert err.offset == start and "exceeds" in err.reason
    err = error_of(good, max_record_bytes=4)
    assert "exceeds the 4-byte limit" in err.reason


def test_oversized_header_length(good):
    data = good[:PREAMBLE_SIZE] + FRAME.pack(1 << 30, 0) + good[PREAMBLE_SIZE + FRAME.size:]
    err = error_of(data)
    assert err.offset == PREAMBLE_SIZE and "exceeds" in err.reason


def _framed_with_good_crc(body: bytes) -> bytes:
    return FRAME.pack(len(body), zlib.crc32(body, zlib.crc32(LENGTH.pack(len(body))))) + body


def test_hostile_msgpack_with_a_valid_crc(good):
    start = record_offsets(good)[0]
    for body in (b"\xdd\xff\xff\xff\xff",  # array32 claiming 4G items in 5 bytes
                 b"\xc1",  # reserved byte
                 b"\x91" * 5000 + b"\x90",  # deep nesting
                 b"\x92\xa2al\x01\x02",  # extra data after the array
                 b"\xd9\x02\xff\xfe",  # invalid utf-8 string
                 b"\xc7\x01\x05\x00"):  # ext type
        err = error_of(good[:start] + _framed_with_good_crc(body))
        assert err.offset == start


def test_header_must_be_a_valid_map(good):
    for header in ([1, 2], {"geometry": {"num_pages": 0}, "checkpoint_every": 1},
                   {"geometry": {"num_pages": "8"}, "checkpoint_every": 1}, {"checkpoint_every": 1},
                   {"geometry": {"num_pages": 8}, "checkpoint_every": -1},
                   {"geometry": {"num_pages": 8}, "checkpoint_every": 1, "initial": "snapshot"}):
        data = MAGIC + (1).to_bytes(2, "little") + frame(msgpack.packb(header))
        err = error_of(data)
        assert err.offset == PREAMBLE_SIZE, header


def test_salvage_reports_where_it_stopped(good):
    offsets = record_offsets(good)
    data = bytearray(good)
    data[offsets[4] + FRAME.size] ^= 0xFF
    reader = LogReader(io.BytesIO(bytes(data)), salvage=True)
    events = list(reader.events())
    assert len(events) == 4  # records 0 and 2 are blocks of two events; 1 and 3 checkpoints
    assert reader.stopped is not None and reader.stopped.offset == offsets[4]
    assert "CRC" in reader.stopped.reason


def test_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_events(tmp_path / "nope.kvlog")


# -- hypothesis: arbitrary and mutated bytes ---------------------------------------------
def outcome(data: bytes) -> str:
    try:
        read_all(data, max_record_bytes=1 << 16)
        return "ok"
    except LogFormatError as err:
        assert 0 <= err.offset <= len(data)
        return "error"


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=512))
def test_arbitrary_bytes_are_events_or_a_format_error(data):
    outcome(data)
    outcome(MAGIC + (1).to_bytes(2, "little") + data)


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.data())
def test_mutated_logs_are_events_or_a_format_error(good, data):
    buf = bytearray(good)
    for _ in range(data.draw(st.integers(1, 4))):
        action = data.draw(st.sampled_from(["flip", "set", "cut", "insert", "delete"]))
        if not buf:
            break
        position = data.draw(st.integers(0, len(buf) - 1))
        if action == "flip":
            buf[position] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "set":
            buf[position] = data.draw(st.integers(0, 255))
        elif action == "cut":
            del buf[position:]
        elif action == "insert":
            buf[position:position] = data.draw(st.binary(min_size=1, max_size=16))
        else:
            del buf[position: position + data.draw(st.integers(1, 16))]
    result = outcome(bytes(buf))
    if bytes(buf) != good:
        # Any real change to a framed log is detected (CRC32 catches these edits).
        assert result == "error" or bytes(buf) == good


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_well_framed_garbage_records_are_a_format_error(good, bodies):
    start = record_offsets(good)[0]
    data = good[:start] + b"".join(_framed_with_good_crc(b) for b in bodies)
    assert outcome(data) == "error"
