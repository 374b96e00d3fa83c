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

:func:`decode_event_batch` accepts both, plus SGLang's batches: the older
positional ones (fewer trailing fields) and SGLang 0.5.23's maps (which omit
``medium`` / ``lora_name`` when None and add ``cache_salt``, dropped here),
with signed int64 hashes and ``attn_dp_rank`` in the batch's rank slot.
Malformed input raises :class:`KVEventDecodeError`, never a bare msgpack error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import msgpack

from kvstate.vllm.kv_event_types import (
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
    "decode_event_batch",
    "encode_event_batch",
]

WireFormat = Literal["map", "array"]

_INT_MIN = -(1 << 63)
_UINT_LIMIT = 1 << 64
_MAX_PAYLOAD_BYTES = 256 * 1024 * 1024


# Field layouts in declaration order: (name, always written in map form).
# vLLM 0.33 writes the fields without a default even when they are None.
_STORED_FIELDS: tuple[tuple[str, bool], ...] = (
    ("block_hashes", True),
    ("parent_block_hash", True),
    ("token_ids", True),
    ("block_size", True),
    ("lora_id", True),
    ("medium", True),
    ("lora_name", True),
    ("extra_keys", False),
    ("group_idx", False),
    ("kv_cache_spec_kind", False),
    ("kv_cache_spec_sliding_window", False),
    ("locality", False),
    ("ownership", False),
    ("session_id", False),
    ("lookahead_token_ids", False),
)
_REMOVED_FIELDS: tuple[tuple[str, bool], ...] = (
    ("block_hashes", True),
    ("medium", True),
    ("group_idx", False),
    ("locality", False),
    ("ownership", False),
)
# How many fields the array form always writes (the snapshot schema of reference §2.4).
_STORED_ARRAY_FIXED = 11
_REMOVED_ARRAY_FIXED = 3
# Fields a decoded event must carry.  Narrower than "always written": SGLang
# leaves out ``medium`` and ``lora_name`` when they are None, and older vLLM
# schemas lack them, so the decoder fills them with None.
_DECODE_REQUIRED = frozenset({"block_hashes", "parent_block_hash", "token_ids", "block_size"})

_LAYOUTS: dict[str, tuple[tuple[str, bool], ...]] = {
    "BlockStored": _STORED_FIELDS,
    "BlockRemoved": _REMOVED_FIELDS,
    "AllBlocksCleared": (),
}
_FIXED_ARRAY_FIELDS = {"BlockStored": _STORED_ARRAY_FIXED, "BlockRemoved": _REMOVED_ARRAY_FIXED}


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
    if tag not in _LAYOUTS:
        raise KVEventEncodeError(f"not a KV cache event: {event!r}")
    layout = _LAYOUTS[tag]
    if wire_format == "map":
        parts = [_pack("type"), _pack(tag)]
        for name, required in layout:
            value = getattr(event, name)
            if required or value is not None:
                parts.append(_pack(name))
                parts.append(_pack(value))
        return _map_header(len(parts) // 2, len(layout) + 1) + b"".join(parts)
    values = [getattr(event, name) for name, _ in layout]
    fixed = _FIXED_ARRAY_FIELDS.get(tag, 0)
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


# ----------------------------------------------------------------------------- decoding


def _fail(where: str, message: str) -> KVEventDecodeError:
    return KVEventDecodeError(f"{where}: {message}")


def _check_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, f"expected an int, got {type(value).__name__}")
    if not _INT_MIN <= value < _UINT_LIMIT:
        raise _fail(where, "integer out of 64-bit range")
    return value


def _check_optional_int(value: Any, where: str) -> int | None:
    return None if value is None else _check_int(value, where)


def _check_optional_str(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise _fail(where, f"expected a string or nil, got {type(value).__name__}")


def _check_hash(value: Any, where: str) -> ExternalBlockHash:
    if isinstance(value, bytes):
        return value
    return _check_int(value, where)


def _check_list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(where, f"expected an array, got {type(value).__name__}")
    return value


def _check_hash_list(value: Any, where: str) -> tuple[ExternalBlockHash, ...]:
    items = _check_list(value, where)
    return tuple(_check_hash(item, f"{where}[{index}]") for index, item in enumerate(items))


def _check_int_list(value: Any, where: str) -> tuple[int, ...]:
    items = _check_list(value, where)
    return tuple(_check_int(item, f"{where}[{index}]") for index, item in enumerate(items))


def _check_key_atom(value: Any, where: str) -> Any:
    if isinstance(value, list):
        return tuple(_check_key_atom(item, where) for item in value)
    if value is None or isinstance(value, (str, bytes, bool, float)):
        return value
    if isinstance(value, int):
        return _check_int(value, where)
    raise _fail(where, f"unsupported extra-key value of type {type(value).__name__}")


def _check_extra_keys(value: Any, where: str) -> tuple[tuple[Any, ...] | None, ...] | None:
    if value is None:
        return None
    entries = _check_list(value, where)
    checked: list[tuple[Any, ...] | None] = []
    for index, entry in enumerate(entries):
        if entry is None:
            checked.append(None)
        else:
            items = _check_list(entry, f"{where}[{index}]")
            checked.append(tuple(_check_key_atom(item, f"{where}[{index}]") for item in items))
    return tuple(checked)


def _check_lookahead(value: Any, where: str) -> tuple[tuple[int, ...], ...] | None:
    if value is None:
        return None
    rows = _check_list(value, where)
    return tuple(_check_int_list(row, f"{where}[{index}]") for index, row in enumerate(rows))


_CHECKERS: dict[str, Callable[[Any, str], Any]] = {
    "block_hashes": _check_hash_list,
    "parent_block_hash": lambda value, where: None if value is None else _check_hash(value, where),
    "token_ids": _check_int_list,
    "block_size": _check_int,
    "lora_id": _check_optional_int,
    "medium": _check_optional_str,
    "lora_name": _check_optional_str,
    "extra_keys": _check_extra_keys,
    "group_idx": _check_optional_int,
    "kv_cache_spec_kind": _check_optional_str,
    "kv_cache_spec_sliding_window": _check_optional_int,
    "locality": _check_optional_str,
    "ownership": _check_optional_str,
    "session_id": _check_optional_str,
    "lookahead_token_ids": _check_lookahead,
}
_CLASSES: dict[str, Any] = {
    "BlockStored": BlockStored,
    "BlockRemoved": BlockRemoved,
    "AllBlocksCleared": AllBlocksCleared,
}
# Minimum positional fields after the tag in the array form: the oldest
# published schemas (vLLM #16750 BlockStored, SGLang BlockRemoved) stop here.
_MIN_ARRAY_FIELDS = {"BlockStored": 5, "BlockRemoved": 1, "AllBlocksCleared": 0}


def _decode_event(raw: Any, where: str) -> KVCacheEvent:
    if isinstance(raw, dict):
        tag = raw.get("type")
        if tag not in _CLASSES:
            raise _fail(where, f"unknown or missing event type {tag!r}")
        fields: dict[str, Any] = {}
        for name, required in _LAYOUTS[tag]:
            if name in raw:
                fields[name] = _CHECKERS[name](raw[name], f"{where}.{name}")
            elif name in _DECODE_REQUIRED:
                raise _fail(where, f"{tag} lacks required field {name!r}")
            elif required:
                fields[name] = None
        return _CLASSES[tag](**fields)  # type: ignore[no-any-return]
    if isinstance(raw, list):
        if not raw or raw[0] not in _CLASSES:
            raise _fail(where, f"unknown or missing event tag {raw[:1]!r}")
        tag = raw[0]
        values = raw[1:]
        if len(values) < _MIN_ARRAY_FIELDS[tag]:
            raise _fail(where, f"{tag} array has only {len(values)} fields")
        fields = {}
        for (name, _), value in zip(_LAYOUTS[tag], values, strict=False):
            fields[name] = _CHECKERS[name](value, f"{where}.{name}")
        for name, required in _LAYOUTS[tag]:
            if required and name not in fields:
                fields[name] = None  # an older schema without medium / lora_name
        return _CLASSES[tag](**fields)  # type: ignore[no-any-return]
    raise _fail(where, f"an event must be a map or an array, got {type(raw).__name__}")


def decode_event_batch(data: bytes) -> KVEventBatch:
    """Decode a batch in either wire form.  Raises :class:`KVEventDecodeError`.

    Trailing batch or event elements beyond the known schema are ignored, as
    msgspec's positional decoder does; unknown map keys are ignored too.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise KVEventDecodeError(f"expected bytes, got {type(data).__name__}")
    if len(data) > _MAX_PAYLOAD_BYTES:
        raise KVEventDecodeError(f"payload of {len(data)} bytes exceeds the limit")
    try:
        wire = msgpack.unpackb(
            bytes(data),
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_ext_len=0,
        )
    except Exception as error:  # msgpack raises several unrelated types
        raise KVEventDecodeError(f"not valid msgpack: {error}") from error
    batch = _check_list(wire, "batch")
    if len(batch) < 2:
        raise _fail("batch", f"expected [ts, events, rank], got {len(batch)} elements")
    ts = batch[0]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise _fail("batch.ts", f"expected a number, got {type(ts).__name__}")
    raw_events = _check_list(batch[1], "batch.events")
    events = [_decode_event(raw, f"batch.events[{index}]") for index, raw in enumerate(raw_events)]
    rank = _check_optional_int(batch[2], "batch.data_parallel_rank") if len(batch) > 2 else None
    return KVEventBatch(ts=float(ts), events=events, data_parallel_rank=rank)
