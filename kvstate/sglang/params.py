"""SGLang 0.5.23's parameter and result objects, with 0.5.23's field names.

0.5.23 wraps the cache calls in these (``match_prefix(MatchPrefixParams(
key=RadixKey(...)))`` returns a ``MatchResult``, and so on).  ``RadixCache``
takes them beside the plain seed-000 forms.  They are plain records owned by
the caller; nothing here touches the engine.

kvstate's tree has one namespace: a key with an ``extra_key`` or a
``cache_salt``, or an EAGLE bigram view, is refused (``ValueError``) rather
than silently matched against other namespaces (docs/deviations.md).
Fields that only hybrid (SWA, Mamba) or hierarchical caches read are kept
with 0.5.23's defaults so code that reads them works; ``RadixCache`` leaves
them at those defaults, as 0.5.23's ``RadixCache`` does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple


class RadixKey:
    """Token ids of a match or insert key; ``limit`` caps them without a copy."""

    __slots__ = ("token_ids", "extra_key", "is_bigram", "limit", "cache_salt")

    def __init__(self, token_ids: Sequence[int], extra_key: str | None = None,
                 is_bigram: bool = False, limit: int | None = None,
                 cache_salt: str | None = None) -> None:
        self.token_ids = token_ids
        self.extra_key = extra_key
        self.is_bigram = is_bigram
        self.limit = limit
        self.cache_salt = cache_salt or None

    def __len__(self) -> int:
        n = len(self.token_ids)
        return n if self.limit is None else min(n, max(self.limit, 0))

    def __repr__(self) -> str:
        return f"RadixKey(len={len(self)}, extra_key={self.extra_key!r})"


@dataclasses.dataclass
class MatchPrefixParams:
    key: Any  # a RadixKey (or anything with ``token_ids``)
    cow_mamba: bool = False
    req: Any = None


class MatchResult(NamedTuple):
    """0.5.23's match result; the matched slots are ``path_device_indices(last_device_node)``."""

    device_prefix_len: int
    last_device_node: Any
    last_host_node: Any
    best_match_node: Any
    host_hit_length: int = 0
    swa_host_hit_length: int = 0
    swa_branching_seqlen: int | None = None
    mamba_host_hit_length: int = 0
    mamba_branching_seqlen: int | None = None
    cache_protected_len: int | None = None
    full_kv_hit_length: int = 0
    cache_actions: Sequence[Any] = ()
    last_visited_node_id: int | None = None
    full_device_match_len: int | None = None


@dataclasses.dataclass
class InsertParams:
    """``priority`` and ``inserted_len`` feed 0.5.23's priority policy and hit counts;
    kvstate's LRU and FIFO policies do not read them."""

    key: Any = None
    value: Any = None
    mamba_value: Any = None
    prev_prefix_len: int = 0
    swa_branching_seqlen: int | None = None
    inserted_len: int = 0
    priority: int = 0


@dataclasses.dataclass
class InsertResult:
    prefix_len: int
    total_len: int = 0
    last_device_node: Any = None
    mamba_exist: bool = False
    swa_branch_inserted: bool = False


@dataclasses.dataclass
class EvictParams:
    num_tokens: int = 0
    swa_num_tokens: int = 0
    mamba_num: int = 0


@dataclasses.dataclass
class EvictResult:
    num_tokens_evicted: int = 0
    swa_num_tokens_evicted: int = 0
    mamba_num_evicted: int = 0


@dataclasses.dataclass
class DecLockRefParams:
    node_id: int | None = None


@dataclasses.dataclass
class IncLockRefResult:
    """``delta`` is minus the tokens moved from evictable to protected."""

    delta: int | None = None
    node_id: int | None = None

    def to_dec_params(self) -> DecLockRefParams:
        return DecLockRefParams(node_id=self.node_id)


@dataclasses.dataclass
class DecLockRefResult:
    delta: int | None = None


@dataclasses.dataclass
class TreeLock:
    """What ``RadixCache.lock`` returns and ``unlock`` takes back."""

    node: Any
    receipt: DecLockRefParams


@dataclasses.dataclass
class CacheInitParams:
    """The constructor arguments of 0.5.23's ``RadixCache(params)`` that kvstate honours."""

    disable: bool = False
    req_to_token_pool: Any = None
    token_to_kv_pool_allocator: Any = None
    page_size: int = 1
    eviction_policy: str = "lru"


__all__ = ["CacheInitParams", "DecLockRefParams", "DecLockRefResult", "EvictParams", "EvictResult",
           "IncLockRefResult", "InsertParams", "InsertResult", "MatchPrefixParams", "MatchResult",
           "RadixKey", "TreeLock"]
