"""Builders of hostile logs: well framed (valid CRCs), typed wrong, absurd, or deep.

Shared by the adversarial tests.  Each builder returns the bytes of a whole
log, so a test can write it, read it in process, or hand it to a command in
a memory-limited subprocess.  Only ``msgpack`` and the frame layout are
used (not the writer), so a bug in the writer cannot hide one here.  Owned
by the log/replay tests.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import msgpack

from kvstate.msgpack_raw import array_header

MAGIC = b"\x89KVS\r\n\x1a\n"
INF = b"\xcb\x7f\xf0\x00\x00\x00\x00\x00\x00"  # float64 +inf
NEG_ZERO = b"\xcb\x80\x00\x00\x00\x00\x00\x00\x00"  # float64 -0.0
BLOCK_GEOMETRY = {"num_pages": 8, "page_size": 4, "num_rows": 0, "mode": "block"}
RADIX_GEOMETRY = {"num_pages": 8, "page_size": 1, "num_rows": 4}


def frame(body: bytes) -> bytes:
    length = struct.pack("<I", len(body))
    return struct.pack("<II", len(body), zlib.crc32(body, zlib.crc32(length))) + body


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


def header(geometry: dict[str, Any] | None = None, version: int = 1, **extra: Any) -> bytes:
    """Preamble and header frame of a format ``version`` log (checkpoints off by default)."""
    fields = {"geometry": geometry or RADIX_GEOMETRY, "checkpoint_every": 0, **extra}
    if version >= 2:
        fields["format"] = version
    return MAGIC + version.to_bytes(2, "little") + frame(pack(fields))


def end(count: int) -> bytes:
    """A format 1 end record (format 1 logs carry no digest, so any fingerprint frames)."""
    return frame(pack(["#e", 1, count, b"\0" * 16]))


def log(bodies: list[bytes], geometry: dict[str, Any] | None = None, **extra: Any) -> bytes:
    """A format 1 log of ``bodies`` (raw record bodies) and an end record counting them."""
    return header(geometry, **extra) + b"".join(frame(b) for b in bodies) + end(len(bodies))


array = array_header  # a msgpack array header for ``count`` items


def nested(depth: int, leaf: bytes = b"\x01") -> bytes:
    """``depth`` one-element arrays around ``leaf``."""
    return b"\x91" * depth + leaf


def record(tag: str, fields: list[bytes], version: int = 1) -> bytes:
    """``[tag, version, *fields]`` with each field given as raw msgpack."""
    return array(len(fields) + 2) + pack(tag) + pack(version) + b"".join(fields)


# Raw msgpack values that are not an int of 0..2**63-1, yet decode to something int-like
# in a careless decoder: a bool, floats, bytes, a digit string, out-of-range ints, nesting.
NOT_AN_ID = {
    "false": b"\xc2", "true": b"\xc3", "neg_zero": NEG_ZERO, "inf": INF, "one_point_oh": pack(1.0),
    "bytes_7": pack(b"7"), "str_7": pack("7"), "minus_one": pack(-1), "two_63": pack(2**63),
    "two_64_minus_1": pack(2**64 - 1), "nil": b"\xc0", "nested_500": nested(500),
    "map": pack({1: 2}), "ext": b"\xd4\x01\x00",
}
