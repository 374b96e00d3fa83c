"""vLLM KV-cache events and their msgpack wire forms.

The event classes (``kvstate.vllm.kv_event_types``, re-exported here) carry
vLLM 0.33's names and are immutable.  Nothing here mutates an event or a batch.

Two wire forms (``format=`` of :func:`encode_event_batch`):

``"map"``
    vLLM 0.33 (since PR #42892): the batch is a 3-element array
    ``[ts, events, data_parallel_rank]``; each event is a map whose first key is
    ``"type"`` (the class name), followed by the fields in declaration order.
    Fields with a ``None`` default are left out while ``None``; required fields
    are always written, ``None`` included.
``"array"``
    SGLang and vLLM before #42892: each event is an array whose first element
    is the class name, followed by the fields by position.  A ``BlockStored``
    has the 12 elements of the snapshot schema (nil padded, as msgspec writes
    them) and a ``BlockRemoved`` 4; fields that 0.33 added later are appended
    only when set, so older positional decoders still read the prefix.

:func:`decode_event_batch` (from :mod:`kvstate.vllm.kv_event_decode`,
re-exported here) accepts both, plus SGLang's batches, and is total over
bytes: malformed input raises :class:`KVEventDecodeError`.
"""

from __future__ import annotations

from typing import Any, Literal

import msgpack

from kvstate.vllm.kv_event_decode import (
    MAX_EXTRA_KEY_DEPTH,
    MAX_PAYLOAD_BYTES,
    batch_from_wire,
    decode_event_batch,
    unpack_wire,
)
from kvstate.vllm.kv_event_types import (
    ARRAY_FIXED_FIELDS,
    FIELD_LAYOUTS,
    MEDIUM_CPU,
    MEDIUM_GPU,
    MEDIUM_STORAGE,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVCacheEvent,
    KVEventBatch,
    KVEventDecodeError,
    KVEventEncodeError,
)

__all__ = [
    "MEDIUM_CPU",
    "MEDIUM_GPU",
    "MEDIUM_STORAGE",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "ExternalBlockHash",
    "KVCacheEvent",
    "KVEventBatch",
    "KVEventDecodeError",
    "KVEventEncodeError",
    "MAX_EXTRA_KEY_DEPTH",
    "MAX_PAYLOAD_BYTES",
    "batch_from_wire",
    "decode_event_batch",
    "encode_event_batch",
    "unpack_wire",
]

WireFormat = Literal["map", "array"]




def _pack(value: Any) -> bytes:
    try:
        return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]
    except (OverflowError, TypeError, ValueError) as error:
        raise KVEventEncodeError(f"cannot encode {value!r}: {error}") from error


def _array_header(count: int) -> bytes:
    if count < 16:
        return bytes((0x90 | count,))
    if count < 0x10000:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def _map_header(count: int, max_count: int) -> bytes:
    # msgspec sizes a struct's map header by the most entries it could write
    # (every field plus the tag), then fills in the real count: a BlockStored
    # (16 possible entries) always gets a map16 header, even with 8 entries.
    if max_count < 16:
        return bytes((0x80 | count,))
    if max_count < 0x10000:
        return b"\xde" + count.to_bytes(2, "big")
    return b"\xdf" + count.to_bytes(4, "big")


def _encode_event(event: KVCacheEvent, wire_format: WireFormat) -> bytes:
    tag = type(event).__name__
    if tag not in FIELD_LAYOUTS:
        raise KVEventEncodeError(f"not a KV cache event: {event!r}")
    layout = FIELD_LAYOUTS[tag]
    if wire_format == "map":
        parts = [_pack("type"), _pack(tag)]
        for name, required in layout:
            value = getattr(event, name)
            if required or value is not None:
                parts.append(_pack(name))
                parts.append(_pack(value))
        return _map_header(len(parts) // 2, len(layout) + 1) + b"".join(parts)
    values = [getattr(event, name) for name, _ in layout]
    fixed = ARRAY_FIXED_FIELDS.get(tag, 0)
    count = len(values)
    while count > fixed and values[count - 1] is None:
        count -= 1
    return _pack([tag, *values[:count]])


def encode_event_batch(batch: KVEventBatch, format: WireFormat = "map") -> bytes:
    """Encode a batch as msgpack in the given wire form (pure; returns new bytes).

    The bytes equal what vLLM's ``msgspec.msgpack.Encoder`` writes for the same
    batch ("map") or what the array-like schema wrote ("array").
    """
    if format not in ("map", "array"):
        raise ValueError(f"format must be 'map' or 'array', not {format!r}")
    events = [_encode_event(event, format) for event in batch.events]
    return b"".join(
        [
            b"\x93",
            _pack(batch.ts),
            _array_header(len(events)),
            *events,
            _pack(batch.data_parallel_rank),
        ]
    )
