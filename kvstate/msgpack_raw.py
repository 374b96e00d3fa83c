"""Reading and writing msgpack array headers and raw elements without decoding a body.

Shared by the event codec (records and event blocks, whose sizes are checked from their
headers before anything is decoded), the log format (an event block's count) and the
canonical state encoding (arrays streamed chunk by chunk).  Pure byte arithmetic.
"""

from __future__ import annotations

from typing import Any

import msgspec

RAW_ITEMS = msgspec.msgpack.Decoder(list[msgspec.Raw])  # a top-level array, elements raw


def array_header(count: int) -> bytes:
    """The msgpack header of an array of ``count`` elements (fixarray, array 16 or 32)."""
    if count < 16:
        return bytes((0x90 | count,))
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def array_count(body: bytes | memoryview) -> int | None:
    """The element count of a msgpack array header at the start of ``body`` (None: not one)."""
    if not body:
        return None
    first = body[0]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F
    if first == 0xDC and len(body) >= 3:
        return int.from_bytes(body[1:3], "big")
    if first == 0xDD and len(body) >= 5:
        return int.from_bytes(body[1:5], "big")
    return None


def raw_scalar(raw: msgspec.Raw, kind: type) -> Any:
    """``raw`` decoded as ``kind`` (None when it is something else)."""
    try:
        return msgspec.msgpack.decode(raw, type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def raw_kind(raw: msgspec.Raw) -> str:
    """The msgpack kind of a raw element, named as Python would (for messages)."""
    first = bytes(raw)[:1]
    if not first:
        return "nothing"
    byte = first[0]
    if byte <= 0x7F or byte >= 0xE0 or 0xCC <= byte <= 0xD3:
        return "int"
    if 0xA0 <= byte <= 0xBF or 0xD9 <= byte <= 0xDB:
        return "str"
    if byte in (0xC2, 0xC3):
        return "bool"
    if byte in (0xCA, 0xCB):
        return "float"
    if 0xC4 <= byte <= 0xC6:
        return "bytes"
    if byte == 0xC0:
        return "None"
    return "container"


def shown(raw: msgspec.Raw) -> str:
    """A raw element for a message: its repr when it is a string, else its kind."""
    value = raw_scalar(raw, str)
    return repr(value) if value is not None else f"of type {raw_kind(raw)}"
