"""SGLang 0.5.23's ``UnifiedRadixCache(FULL, SWA)`` on the kvstate core.

One radix tree whose nodes carry FULL KV and, in an SWA hybrid, SWA KV that
may be tombstoned.  Every call is a planner decision committed as one batch
(``kvstate.planner.swa_match`` / ``swa_insert`` / ``swa_evict``); the
request-level flows are in ``kvstate.sglang.unified_flows``.  Calls take
0.5.23's parameter objects and return its result forms, with ``TreeNode``
handles where 0.5.23 returns node ids:

* ``match_prefix(MatchPrefixParams)`` -> ``MatchResult`` (``device_prefix_len``,
  ``full_kv_hit_length``, ``swa_branching_seqlen``): ``Split``, ``Touch``,
  ``SwaTouch``;
* ``insert(InsertParams)`` -> ``InsertResult``: ``Touch``, ``Split``,
  ``Insert``, ``SwaAdopt`` / ``SwaRebind``, ``SwaFree`` + ``Free`` /
  ``FreeMapped`` of the duplicates, ``SwaTouch``;
* ``evict`` / ``evict_for_alloc(EvictParams)`` -> ``EvictResult``:
  ``SwaEvict``, ``Evict``;
* ``lock(node)`` -> ``HybridLock``: ``Lock``, ``SwaLock``; ``unlock``:
  ``SwaUnlock`` (unless released early), ``Unlock``; ``release_swa``:
  ``SwaUnlock``.
"""

from __future__ import annotations

from operator import sub
from typing import Any

import torch

from kvstate.events import Reset
from kvstate.planner.swa_evict import plan_evict_for_alloc, plan_unified_evict
from kvstate.planner.swa_insert import InsertSpec, plan_unified_insert
from kvstate.planner.swa_match import (
    Receipt,
    path_slots,
    plan_release_swa,
    plan_unified_lock,
    plan_unified_match,
    plan_unified_unlock,
)
from kvstate.sglang.binding import FrontEndMixin
from kvstate.sglang.hybrid_req import SWA, HybridLock, HybridReceipt, component_name
from kvstate.sglang.inputs import as_int, int64_tensor, int_list, token_ids
from kvstate.sglang.params import EvictResult, InsertResult, MatchResult
from kvstate.sglang.pool import ReqToTokenPool
from kvstate.sglang.swa_allocator import SWATokenToKVPoolAllocator
from kvstate.sglang.tree_view import TreeNode
from kvstate.sglang.unified_flows import UnifiedFlows
from kvstate.state import DETACHED, ROOT, expand_pages, pages_of

_EMPTY_PATH = torch.empty((0,), dtype=torch.int64)  # the root's path; nobody writes to it


class UnifiedRadixCache(UnifiedFlows, FrontEndMixin):
    # The last match's node, the engine's sequence number after it and its path's pages
    # (``path_device_indices`` reads them while no event has happened since).
    _matched_path: tuple[int, int, tuple[int, ...]] | None = None

    def __new__(cls, params: Any = None) -> Any:
        """A tree whose components name MAMBA is a ``kvstate.sglang.mamba_radix_cache.
        MambaUnifiedRadixCache`` (a subclass)."""
        names = {component_name(c) for c in getattr(params, "tree_components", ())}
        if cls is UnifiedRadixCache and "MAMBA" in names:
            from kvstate.sglang.mamba_radix_cache import MambaUnifiedRadixCache

            return super().__new__(MambaUnifiedRadixCache)
        return super().__new__(cls)

    def __init__(self, params: Any) -> None:
        """``UnifiedRadixCache(CacheInitParams(...))`` with ``sliding_window_size`` and
        ``tree_components`` FULL and SWA (names or 0.5.23's ``ComponentType``)."""
        pool, allocator = params.req_to_token_pool, params.token_to_kv_pool_allocator
        if not isinstance(pool, ReqToTokenPool) or not isinstance(allocator,
                                                                  SWATokenToKVPoolAllocator):
            raise TypeError("UnifiedRadixCache(FULL, SWA) needs a ReqToTokenPool and a kvstate "
                            "SWATokenToKVPoolAllocator")
        components = tuple(component_name(c) for c in getattr(params, "tree_components", ()))
        if components != ("FULL", SWA):
            raise ValueError(f"kvstate models tree_components (FULL, SWA), got {components}")
        window = getattr(params, "sliding_window_size", None)
        if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
            raise ValueError("an SWA tree needs a positive sliding_window_size")
        if getattr(params, "eviction_policy", "lru").lower() != "lru":
            raise ValueError("kvstate's hybrid tree evicts by LRU only (0.5.23's default)")
        if allocator.page_size != params.page_size or pool.engine is not allocator.engine:
            raise ValueError("the pool and the allocator must share one engine and page size")
        self.req_to_token_pool = pool
        self.token_to_kv_pool_allocator = allocator
        self.page_size = params.page_size
        self.disable = bool(getattr(params, "disable", False))
        self.sliding_window_size = self.swa_retain_window = window
        self.engine = allocator.engine
        self._at_head = self.page_size > 1  # paged frees go to the head, token frees to the tail

    # -- capabilities and sizes ------------------------------------------------------------
    def supports_swa(self) -> bool:
        return True

    def supports_mamba(self) -> bool:
        return False

    def supports_prefix_sharing(self) -> bool:
        return not self.disable

    def reset(self) -> None:
        """Drop the tree; its pages nobody else holds, and their SWA pages, go back free.
        Commits ``Reset("tree")``."""
        with self.engine.batch() as batch:
            batch.emit(Reset("tree"))

    @property
    def root_node(self) -> TreeNode:
        return TreeNode(self, ROOT)

    def full_evictable_size(self) -> int:
        return int(self.engine.view.evictable_size)

    def full_protected_size(self) -> int:
        return int(self.engine.view.protected_size)

    def swa_evictable_size(self) -> int:
        return int(self.engine.view.swa.evictable)

    def swa_protected_size(self) -> int:
        return int(self.engine.view.swa.protected)

    def evictable_size(self) -> int:
        return self.full_evictable_size()

    def protected_size(self) -> int:
        return self.full_protected_size()

    def total_size(self) -> tuple[int, int]:
        view = self.engine.view
        return (int(view.evictable_size + view.protected_size),
                int(view.swa.evictable + view.swa.protected))

    def path_device_indices(self, node: TreeNode | None) -> torch.Tensor:
        """The FULL slots from the root to ``node`` (int64).  Right after a match, the path
        the match walked (no event since) is read from it instead of walking it again; the
        root's path is one shared empty tensor, as SGLang shares its empty prefix."""
        node_id = self._node_id(node)
        if node_id == ROOT:
            return _EMPTY_PATH
        view = self.engine.view
        matched = self._matched_path
        if matched is not None and matched[0] == node_id and matched[1] == view.seq:
            return int64_tensor(expand_pages(matched[2], self.page_size))
        return int64_tensor(path_slots(view, node_id))

    def prefix_device_indices(self, req: Any) -> torch.Tensor:
        return self.path_device_indices(req.last_node)[: req.prefix_len]

    # -- tree calls ------------------------------------------------------------------
    def match_prefix(self, params: Any) -> MatchResult:
        """See the module docstring; a disabled cache or a key under a page matches nothing."""
        tokens = token_ids(params.key)
        if self.disable:
            return MatchResult(0, self.root_node, self.root_node, self.root_node)
        with self.engine.batch() as batch:
            found = plan_unified_match(batch, tokens, window=self.sliding_window_size)
        self._matched_path = (found.last_node, self.engine.view.seq, found.pages)
        node = TreeNode(self, found.last_node)
        return MatchResult(found.length, node, node, node, swa_branching_seqlen=found.branching_seqlen,
                           full_kv_hit_length=found.full_hit)

    def insert(self, params: Any) -> InsertResult:
        """Insert ``params.key`` -> ``params.value`` (FULL slots of whole pages, from
        ``prev_prefix_len`` on held by one owner: a bare allocation or one request row)."""
        if self.disable:
            return InsertResult(prefix_len=0)
        tokens = token_ids(params.key)
        size = self.page_size
        aligned = len(tokens) // size * size
        slots = int_list(params.value, "insert value")
        if len(slots) < aligned:
            raise ValueError(f"insert value has {len(slots)} slots for a {aligned}-token key")
        pages = pages_of(slots[:aligned], size)
        prev = as_int(getattr(params, "prev_prefix_len", 0) or 0, "prev_prefix_len")
        cursor = _evicted_seqlen(params)
        owner = self._owner(pages[min(prev, aligned) // size:], slots[:aligned])
        branching = getattr(params, "swa_branching_seqlen", None)
        spec = InsertSpec(self.sliding_window_size, prev, cursor, branching, self._at_head)
        with self.engine.batch() as batch:
            result = plan_unified_insert(batch, tokens, pages, owner, spec)
        return InsertResult(prefix_len=result.prefix_len,
                            last_device_node=TreeNode(self, result.last_node),
                            swa_branch_inserted=result.branch_inserted)

    def _owner(self, pages: list[int], slots: list[int]) -> Any:
        """Who holds the pages the insert may take or free (checked before any event)."""
        size = self.page_size
        # every slot at its index's offset in a page: (slot - index) % size == 0, in C
        if size > 1 and any(map(size.__rmod__, map(sub, slots, range(len(slots))))):
            raise ValueError("insert value slots do not follow whole pages in key order")
        view = self.engine.view
        owners = set(map(view.holders.get, pages))
        if any(map(view.page_node.__contains__, pages)) or len(owners) > 1 or (
                owners and None in owners) or len(set(pages)) != len(pages):
            raise ValueError("an insert value's pages past prev_prefix_len must be held by one "
                             "owner, outside the tree, each once")
        held = owners.pop() if owners else (DETACHED,)
        if len(held) != 1:
            raise ValueError(f"insert value pages are shared by {list(held)}")
        return held[0]

    def evict(self, params: Any) -> EvictResult:
        """Evict toward ``num_tokens`` FULL and ``swa_num_tokens`` SWA tokens."""
        full = as_int(getattr(params, "num_tokens", 0), "num_tokens")
        swa = as_int(getattr(params, "swa_num_tokens", 0), "swa_num_tokens")
        if self.disable or not (full or swa):
            return EvictResult()
        with self.engine.batch() as batch:
            done = plan_unified_evict(batch, full, swa, at_head=self._at_head)
        return EvictResult(done.full, done.swa, 0)

    def evict_for_alloc(self, params: Any) -> EvictResult:
        """Evict until each pool has its shortfall free (counts are shortfalls)."""
        full = as_int(getattr(params, "num_tokens", 0), "num_tokens")
        swa = as_int(getattr(params, "swa_num_tokens", 0), "swa_num_tokens")
        if self.disable or not (full or swa):
            return EvictResult()
        with self.engine.batch() as batch:
            done = plan_evict_for_alloc(batch, full, swa, at_head=self._at_head)
        return EvictResult(done.full, done.swa, 0)

    # -- locks ------------------------------------------------------------------------
    def lock(self, node: Any, skip_lock_components: Any = ()) -> HybridLock:
        """Lock ``node``'s FULL path and SWA window.  Commits ``Lock`` and ``SwaLock``."""
        if skip_lock_components:
            raise ValueError("kvstate's hybrid locks take every component")
        node_id = self._node_id(node)
        if self.disable or node_id == ROOT:
            receipt = Receipt(ROOT, 0, False)
        else:
            with self.engine.batch() as batch:
                receipt = plan_unified_lock(batch, node_id, window=self.sliding_window_size)
        uuids = {SWA: receipt.uuid or None}  # 0.5.23 records None for a root window
        return HybridLock(TreeNode(self, node_id), HybridReceipt(node_id, uuids))

    def unlock(self, lock: HybridLock | None) -> None:
        """Release ``lock``.  Commits ``SwaUnlock`` (unless released early), ``Unlock``."""
        if lock is None or self.disable:
            return
        if not isinstance(lock, HybridLock):
            raise TypeError(f"{lock!r} is not a lock of a hybrid tree")
        if lock.released:
            raise ValueError("this lock was already unlocked")
        planned = lock.planned()
        with self.engine.batch() as batch:
            if planned.node != ROOT:
                plan_unified_unlock(batch, planned)
            lock.released = True  # inside the batch: a listener may fail at its commit

    def release_swa(self, lock: HybridLock | None) -> None:
        """Release the SWA window of ``lock`` early, once.  Commits ``SwaUnlock``."""
        if self.disable or lock is None or lock.swa_released:
            return
        planned = lock.planned()
        with self.engine.batch() as batch:
            if planned.swa:
                plan_release_swa(batch, planned)
            lock.swa_released = True  # inside the batch: a listener may fail at its commit

    def _node_id(self, node: Any) -> int:
        if node is None:
            return ROOT
        if isinstance(node, TreeNode) and node._cache is self:
            return as_int(node.id, "tree node id")
        raise TypeError(f"{node!r} is not a node of this cache")


def _evicted_seqlen(params: Any) -> int:
    getter = getattr(params, "get_evicted_seqlen", None)
    return as_int(getter(SWA), "SWA evicted seqlen") if getter is not None else 0


__all__ = ["HybridLock", "HybridReceipt", "UnifiedRadixCache"]
