"""A minimal canonical CBOR encoder (RFC 8949 / RFC 7049 "canonical").

vLLM's ``sha256_cbor`` block hash digests ``cbor2.dumps(value, canonical=True)``.
This module produces the same bytes for the value shapes block hashing uses,
so kvstate needs no ``cbor2`` dependency:

* ``None``, ``True``, ``False`` (simple values ``f6``, ``f5``, ``f4``);
* ``int`` of any size: shortest head for ``-2**64 <= n < 2**64``, and a tagged
  bignum (tag 2 or 3) beyond, as cbor2 does;
* ``bytes`` / ``bytearray`` / ``memoryview`` (major type 2) and ``str``
  (major type 3, UTF-8);
* ``tuple`` and ``list`` (both major type 4: CBOR has one array type);
* ``dict`` (major type 5) with keys ordered by (encoded length, encoded bytes);
* ``float`` in the shortest of half/single/double precision that keeps the
  value, with NaN and the infinities as half precision.

Anything else raises :class:`CborEncodeError`.  The encoder is a pure function
of its argument: it never mutates the value and keeps no state between calls.
"""

from __future__ import annotations

import math
import struct
from typing import Any

__all__ = ["CborEncodeError", "encode_canonical"]

_UINT64_LIMIT = 1 << 64
_MAX_DEPTH = 256


class CborEncodeError(TypeError):
    """The value holds a type (or nesting depth) this encoder does not cover."""


def _head(major_type: int, argument: int) -> bytes:
    """Encode a CBOR item head with the shortest argument form."""
    prefix = major_type << 5
    if argument < 24:
        return bytes((prefix | argument,))
    if argument < 0x100:
        return bytes((prefix | 24, argument))
    if argument < 0x10000:
        return bytes((prefix | 25,)) + argument.to_bytes(2, "big")
    if argument < 0x100000000:
        return bytes((prefix | 26,)) + argument.to_bytes(4, "big")
    return bytes((prefix | 27,)) + argument.to_bytes(8, "big")


def _encode_int(number: int) -> bytes:
    if 0 <= number < _UINT64_LIMIT:
        return _head(0, number)
    if -_UINT64_LIMIT <= number < 0:
        return _head(1, -1 - number)
    # Bignum: tag 2 (positive) or tag 3 (negative, stores -1 - n) over a byte string.
    tag, magnitude = (2, number) if number > 0 else (3, -1 - number)
    payload = magnitude.to_bytes((magnitude.bit_length() + 7) // 8, "big")
    return _head(6, tag) + _head(2, len(payload)) + payload


def _encode_float(number: float) -> bytes:
    if math.isnan(number):
        return b"\xf9\x7e\x00"
    if math.isinf(number):
        return b"\xf9\x7c\x00" if number > 0 else b"\xf9\xfc\x00"
    try:
        half = struct.pack(">e", number)
        if struct.unpack(">e", half)[0] == number:
            return b"\xf9" + half
    except OverflowError:
        pass
    single = struct.pack(">f", number) if abs(number) <= 3.4028234663852886e38 else None
    if single is not None and struct.unpack(">f", single)[0] == number:
        return b"\xfa" + single
    return b"\xfb" + struct.pack(">d", number)


def _encode(value: Any, out: list[bytes], depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise CborEncodeError(f"nesting deeper than {_MAX_DEPTH} levels")
    if value is None:
        out.append(b"\xf6")
    elif value is True:
        out.append(b"\xf5")
    elif value is False:
        out.append(b"\xf4")
    elif isinstance(value, int):
        out.append(_encode_int(value))
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        out.append(_head(2, len(raw)))
        out.append(raw)
    elif isinstance(value, str):
        encoded = value.encode("utf-8")
        out.append(_head(3, len(encoded)))
        out.append(encoded)
    elif isinstance(value, (tuple, list)):
        out.append(_head(4, len(value)))
        for item in value:
            _encode(item, out, depth + 1)
    elif isinstance(value, dict):
        pairs = []
        for key, item in value.items():
            key_parts: list[bytes] = []
            _encode(key, key_parts, depth + 1)
            item_parts: list[bytes] = []
            _encode(item, item_parts, depth + 1)
            pairs.append((b"".join(key_parts), b"".join(item_parts)))
        pairs.sort(key=lambda pair: (len(pair[0]), pair[0]))
        out.append(_head(5, len(pairs)))
        for encoded_key, encoded_item in pairs:
            out.append(encoded_key)
            out.append(encoded_item)
    elif isinstance(value, float):
        out.append(_encode_float(value))
    else:
        raise CborEncodeError(f"cannot CBOR-encode a value of type {type(value).__name__}")


def encode_canonical(value: Any) -> bytes:
    """Return the canonical CBOR bytes of ``value`` (same bytes as
    ``cbor2.dumps(value, canonical=True)`` for the supported shapes).

    Pure: does not mutate ``value``.  Raises :class:`CborEncodeError` for an
    unsupported type.
    """
    out: list[bytes] = []
    _encode(value, out, 0)
    return b"".join(out)
