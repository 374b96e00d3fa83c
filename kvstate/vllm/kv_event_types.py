"""vLLM 0.33's KV-cache event classes, immutable.

The classes carry vLLM's class and attribute names
(``vllm.distributed.kv_events``) but store sequences as tuples (lists passed
in are converted), so events are hashable and can be shared freely.  Their
msgpack wire forms live in :mod:`kvstate.vllm.kv_events` (encoding) and
:mod:`kvstate.vllm.kv_event_decode` (decoding); the field layouts both follow
are at the end of this module.  Constants and frozen classes only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import attrs
import msgspec
from msgspec.structs import force_setattr

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"

ExternalBlockHash: TypeAlias = int | bytes
"""A published block hash: the digest's low 64 bits (vLLM's default), the raw
digest bytes, or a signed int64 (SGLang)."""

class KVEventDecodeError(ValueError):
    """The bytes are not a KV event batch in either wire form."""


class KVEventEncodeError(ValueError):
    """A batch holds a value that has no msgpack encoding (e.g. an int beyond 64 bits)."""


def _deep_tuple(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_deep_tuple(item) for item in value)
    return value


def _hashes(values: Sequence[ExternalBlockHash]) -> tuple[ExternalBlockHash, ...]:
    return tuple(values)


def _ints(values: Sequence[int]) -> tuple[int, ...]:
    return tuple(values)


def _optional_keys(
    values: Sequence[Sequence[Any] | None] | None,
) -> tuple[tuple[Any, ...] | None, ...] | None:
    if values is None:
        return None
    return tuple(None if keys is None else _deep_tuple(keys) for keys in values)


def _optional_token_lists(
    values: Sequence[Sequence[int]] | None,
) -> tuple[tuple[int, ...], ...] | None:
    return None if values is None else tuple(tuple(tokens) for tokens in values)


class BlockStored(msgspec.Struct, frozen=True, gc=False):
    """Blocks entered the prefix cache (one event per ``cache_full_blocks`` call).

    ``parent_block_hash`` is the hash of the block before ``block_hashes[0]``
    in the chain, ``None`` at the chain start.  ``extra_keys`` holds one
    untagged entry per block (see ``hashing.to_event_extra_keys``).

    A frozen msgspec struct, as vLLM's own event classes are: the pool builds
    one per cached chain, and a struct is built in C.  Sequences passed as
    lists are stored as tuples (``__post_init__``).  Holds no other event, so
    the collector need not track it.
    """

    block_hashes: tuple[ExternalBlockHash, ...]
    parent_block_hash: ExternalBlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: tuple[tuple[Any, ...] | None, ...] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        if type(self.block_hashes) is not tuple:
            force_setattr(self, "block_hashes", _hashes(self.block_hashes))
        if type(self.token_ids) is not tuple:
            force_setattr(self, "token_ids", _ints(self.token_ids))
        extra_keys = self.extra_keys
        # A tuple of Nones (a chain without extra keys, the usual case) is already stored.
        if extra_keys is not None and (type(extra_keys) is not tuple
                                       or extra_keys.count(None) != len(extra_keys)):
            force_setattr(self, "extra_keys", _optional_keys(extra_keys))
        if self.lookahead_token_ids is not None:
            force_setattr(self, "lookahead_token_ids",
                          _optional_token_lists(self.lookahead_token_ids))


def with_spec(event: BlockStored, kind: str | None, window: int | None) -> BlockStored:
    """``event`` with its group's spec kind and sliding window set (what vLLM's manager adds
    to the pool's events)."""
    return msgspec.structs.replace(event, kv_cache_spec_kind=kind,
                                   kv_cache_spec_sliding_window=window)


def stored_event(hashes: tuple[ExternalBlockHash, ...], parent: ExternalBlockHash | None,
                 tokens: tuple[int, ...], block_size: int, lora_id: int | None,
                 lora_name: str | None, extra_keys: tuple[tuple[Any, ...] | None, ...] | None,
                 group_idx: int | None, kind: str | None, window: int | None) -> BlockStored:
    """A GPU ``BlockStored`` from fields already in their stored form (tuples; each extra
    key entry None or a nested tuple): what the pool's event queue builds once per cached
    chain.  Equal to ``BlockStored(...)`` of the same values."""
    return BlockStored(hashes, parent, tokens, block_size, lora_id, MEDIUM_GPU, lora_name,
                       extra_keys, group_idx, kind, window)


@attrs.frozen
class BlockRemoved:
    """Cached blocks were evicted; vLLM emits one per evicted physical block."""

    block_hashes: tuple[ExternalBlockHash, ...] = attrs.field(converter=_hashes)
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


@attrs.frozen
class AllBlocksCleared:
    """The whole prefix cache was reset."""


KVCacheEvent: TypeAlias = BlockStored | BlockRemoved | AllBlocksCleared


def _events(values: Sequence[KVCacheEvent]) -> tuple[KVCacheEvent, ...]:
    return tuple(values)


@attrs.frozen
class KVEventBatch:
    """One engine step's events; ``ts`` is wall-clock seconds set by the publisher."""

    ts: float = attrs.field(converter=float)
    events: tuple[KVCacheEvent, ...] = attrs.field(converter=_events)
    data_parallel_rank: int | None = None


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
DECODE_REQUIRED = frozenset({"block_hashes", "parent_block_hash", "token_ids", "block_size"})

FIELD_LAYOUTS: dict[str, tuple[tuple[str, bool], ...]] = {
    "BlockStored": _STORED_FIELDS,
    "BlockRemoved": _REMOVED_FIELDS,
    "AllBlocksCleared": (),
}
ARRAY_FIXED_FIELDS = {"BlockStored": _STORED_ARRAY_FIXED, "BlockRemoved": _REMOVED_ARRAY_FIXED}
