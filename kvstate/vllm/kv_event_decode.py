"""Decoding of vLLM / SGLang KV-event batches from untrusted bytes (re-exported by ``kv_events``).

:func:`decode_event_batch` accepts both wire forms of :mod:`kvstate.vllm.kv_events`
plus SGLang's batches (older positional ones, 0.5.23's maps without ``medium``
/ ``lora_name`` and with ``cache_salt``, signed int64 hashes, ``attn_dp_rank``
in the rank slot).  It is total over bytes: malformed input raises
:class:`KVEventDecodeError`, never a bare msgpack error, a ``TypeError`` or a
``RecursionError``.  Its limits on untrusted input (``MAX_PAYLOAD_BYTES``,
``MAX_EXTRA_KEY_DEPTH``, the memory a payload may cost) are listed in
``docs/vllm.md``, "Limits on untrusted input".  Pure functions; nothing here
owns state.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable
from typing import Any

import msgpack

from kvstate.vllm.kv_event_types import (
    DECODE_REQUIRED,
    FIELD_LAYOUTS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVCacheEvent,
    KVEventBatch,
    KVEventDecodeError,
)

__all__ = [
    "MAX_EXTRA_KEY_DEPTH",
    "MAX_PAYLOAD_BYTES",
    "batch_from_wire",
    "decode_event_batch",
    "unpack_wire",
]

_INT_MIN = -(1 << 63)
_UINT_LIMIT = 1 << 64
MAX_PAYLOAD_BYTES = 256 * 1024 * 1024
"""Largest payload :func:`decode_event_batch` accepts (callers such as the ZMQ
subscriber set lower limits of their own)."""
MAX_EXTRA_KEY_DEPTH = 16
"""How deeply arrays may nest inside one block's ``extra_keys`` entry.  vLLM
nests one level (a multimodal ``(identifier, offset)`` pair); the bound keeps
checking and hashing a hostile entry from recursing without limit."""

#
# The decoder sees untrusted bytes.  msgpack arrays are unpacked as tuples (the
# event classes store tuples anyway, and the empty tuple is shared, which keeps
# a payload of empty arrays from expanding 60-fold in memory); maps stay dicts.
# Every check raises KVEventDecodeError, and error messages quote values through
# a bounded repr so a huge or deep value cannot make the message itself large.

_SHORT = reprlib.Repr()
_SHORT.maxlevel = 2
_SHORT.maxstring = 40
_SHORT.maxother = 40


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


def _check_list(value: Any, where: str) -> tuple[Any, ...]:
    if not isinstance(value, tuple):
        raise _fail(where, f"expected an array, got {type(value).__name__}")
    return value


def _check_hash_list(value: Any, where: str) -> tuple[ExternalBlockHash, ...]:
    items = _check_list(value, where)
    return tuple(_check_hash(item, f"{where}[{index}]") for index, item in enumerate(items))


def _check_int_list(value: Any, where: str) -> tuple[int, ...]:
    items = _check_list(value, where)
    return tuple(_check_int(item, f"{where}[{index}]") for index, item in enumerate(items))


def _check_key_atom(value: Any, where: str, depth: int) -> Any:
    if isinstance(value, tuple):
        if depth >= MAX_EXTRA_KEY_DEPTH:
            raise _fail(where, f"extra keys nest deeper than {MAX_EXTRA_KEY_DEPTH} arrays")
        for item in value:
            _check_key_atom(item, where, depth + 1)
        return value
    if value is None or isinstance(value, (str, bytes, bool, float)):
        return value
    if isinstance(value, int):
        return _check_int(value, where)
    raise _fail(where, f"unsupported extra-key value of type {type(value).__name__}")


def _check_extra_keys(value: Any, where: str) -> tuple[tuple[Any, ...] | None, ...] | None:
    if value is None:
        return None
    entries = _check_list(value, where)
    for index, entry in enumerate(entries):
        if entry is not None:
            _check_key_atom(_check_list(entry, f"{where}[{index}]"), f"{where}[{index}]", 0)
    return entries


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


def _event_tag(tag: Any, where: str) -> str:
    # A tag of any other type (a list, a map) must not reach the dict lookup: unhashable.
    if not isinstance(tag, str) or tag not in _CLASSES:
        raise _fail(where, f"unknown or missing event type {_SHORT.repr(tag)}")
    return tag


def _decode_event(raw: Any, where: str) -> KVCacheEvent:
    if isinstance(raw, dict):
        tag = _event_tag(raw.get("type"), where)
        fields: dict[str, Any] = {}
        for name, required in FIELD_LAYOUTS[tag]:
            if name in raw:
                fields[name] = _CHECKERS[name](raw[name], f"{where}.{name}")
            elif name in DECODE_REQUIRED:
                raise _fail(where, f"{tag} lacks required field {name!r}")
            elif required:
                fields[name] = None
        return _CLASSES[tag](**fields)  # type: ignore[no-any-return]
    if isinstance(raw, tuple):
        tag = _event_tag(raw[0] if raw else None, where)
        values = raw[1:]
        if len(values) < _MIN_ARRAY_FIELDS[tag]:
            raise _fail(where, f"{tag} array has only {len(values)} fields")
        fields = {}
        for (name, _), value in zip(FIELD_LAYOUTS[tag], values, strict=False):
            fields[name] = _CHECKERS[name](value, f"{where}.{name}")
        for name, required in FIELD_LAYOUTS[tag]:
            if required and name not in fields:
                fields[name] = None  # an older schema without medium / lora_name
        return _CLASSES[tag](**fields)  # type: ignore[no-any-return]
    raise _fail(where, f"an event must be a map or an array, got {type(raw).__name__}")


def unpack_wire(data: bytes) -> Any:
    """msgpack-decode untrusted bytes the way :func:`decode_event_batch` does
    (arrays as tuples, string map keys, no ext types).  Raises ``KVEventDecodeError``."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise KVEventDecodeError(f"expected bytes, got {type(data).__name__}")
    if len(data) > MAX_PAYLOAD_BYTES:
        raise KVEventDecodeError(f"payload of {len(data)} bytes exceeds the limit")
    try:
        return msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=True, max_ext_len=0)
    except Exception as error:  # msgpack raises several unrelated types
        raise KVEventDecodeError(f"not valid msgpack: {error}") from error


def batch_from_wire(wire: Any) -> KVEventBatch:
    """Check an already unpacked batch (arrays as tuples, see :func:`unpack_wire`)
    and build it.  Raises :class:`KVEventDecodeError`; pure."""
    try:
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
    except RecursionError as error:  # a safety net: the depth limits above should prevent it
        raise KVEventDecodeError("batch nests too deeply to check") from error


def decode_event_batch(data: bytes) -> KVEventBatch:
    """Decode a batch in either wire form.  Raises :class:`KVEventDecodeError`.

    Trailing batch or event elements beyond the known schema are ignored, as
    msgspec's positional decoder does; unknown map keys are ignored too.
    """
    return batch_from_wire(unpack_wire(data))
