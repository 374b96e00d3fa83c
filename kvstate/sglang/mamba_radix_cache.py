"""SGLang 0.5.23's ``UnifiedRadixCache(FULL, MAMBA)`` and ``(FULL, SWA, MAMBA)`` on the kvstate core.

``UnifiedRadixCache(params)`` builds this class when ``params.tree_components``
names MAMBA.  One radix tree whose nodes carry FULL KV, SWA KV (with an SWA
pool) and, at some node ends, a Mamba state slot.  Every call is a planner
decision committed as one batch; the request flows are in
``kvstate.sglang.mamba_flows``:

* ``match_prefix(MatchPrefixParams(key, cow_mamba, req))`` -> ``MatchResult``
  (the hit never passes the last state; ``mamba_branching_seqlen``): ``Split``,
  ``SwaTouch``, ``MambaTouch``, ``Touch``; with ``cow_mamba`` the hit's state
  is copied into the request's slot (``MambaAlloc`` under a temporary lock and
  eviction when needed, ``MambaCopy``);
* ``insert(InsertParams(key, value, mamba_value, ...))`` -> ``InsertResult``
  (``mamba_exist``): the walk's events, then ``MambaCommit`` or ``MambaTouch``;
* ``evict`` / ``evict_for_alloc(EvictParams(num_tokens, swa_num_tokens,
  mamba_num))`` -> ``EvictResult``: ``SwaEvict``, ``MambaEvict``, ``Evict``;
* ``lock`` -> ``MambaTreeLock``: ``Lock``, ``SwaLock``, ``MambaLock``;
  ``unlock`` / ``release_swa``: their reverse.

The checkpoint grid is ``lcm(max(mamba_chunk_size, page), page)`` and the
decode track grid ``lcm(grid, mamba_track_interval)`` (0.5.23 reads them from
the server arguments; kvstate takes them from ``MambaCacheInitParams``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from kvstate.planner.mamba_evict import plan_mamba_evict, plan_mamba_evict_for_alloc
from kvstate.planner.mamba_insert import MambaInsertSpec, plan_mamba_insert
from kvstate.planner.mamba_match import (
    MambaReceipt,
    plan_mamba_lock,
    plan_mamba_match,
    plan_mamba_release_swa,
    plan_mamba_unlock,
)
from kvstate.planner.mamba_slots import plan_copy_on_match
from kvstate.sglang.allocator import TokenToKVPoolAllocator
from kvstate.sglang.hybrid_req import SWA, HybridCacheInitParams, HybridLock, HybridReceipt, component_name
from kvstate.sglang.inputs import as_int, int_list, token_ids
from kvstate.sglang.mamba_flows import MambaFlows
from kvstate.sglang.mamba_pool import HybridReqToTokenPool
from kvstate.sglang.mamba_req import MAMBA
from kvstate.sglang.params import EvictResult, InsertResult, MatchResult
from kvstate.sglang.swa_allocator import SWATokenToKVPoolAllocator
from kvstate.sglang.tree_view import TreeNode
from kvstate.sglang.unified_radix_cache import UnifiedRadixCache
from kvstate.state import ROOT, pages_of

MAMBA_TRACK_INTERVAL = 256  # 0.5.23's default mamba_track_interval
FLA_CHUNK_SIZE = 64  # the chunk 0.5.23 assumes when the model config names none


@dataclasses.dataclass
class MambaCacheInitParams(HybridCacheInitParams):
    """0.5.23's ``CacheInitParams`` fields a Mamba ``UnifiedRadixCache`` reads, plus the two
    grids 0.5.23 takes from its server arguments."""

    tree_components: tuple[Any, ...] = ("FULL", MAMBA)
    enable_mamba_extra_buffer: bool = False
    mamba_chunk_size: int = FLA_CHUNK_SIZE
    mamba_track_interval: int = MAMBA_TRACK_INTERVAL


@dataclasses.dataclass
class MambaTreeLock(HybridLock):
    """0.5.23's ``TreeLock`` of a Mamba tree; ``mamba_locked``: the hit's state is pinned."""

    mamba_locked: bool = False
    has_swa: bool = False

    def mamba_receipt(self) -> MambaReceipt:
        planned = self.planned()  # the ids checked as ints, as a hybrid lock's are
        node_id, uuid = planned.node, planned.uuid
        swa = self.has_swa and not self.swa_released
        mamba = self.mamba_locked and not (self.has_swa and self.swa_released)
        return MambaReceipt(node_id, uuid, swa and node_id != ROOT, mamba)


class MambaUnifiedRadixCache(MambaFlows, UnifiedRadixCache):
    def __init__(self, params: Any) -> None:
        """``UnifiedRadixCache(CacheInitParams(...))`` with ``tree_components`` (FULL, MAMBA)
        or (FULL, SWA, MAMBA), a ``HybridReqToTokenPool`` and, with SWA, a kvstate
        ``SWATokenToKVPoolAllocator`` (else a token or paged allocator)."""
        components = tuple(component_name(c) for c in getattr(params, "tree_components", ()))
        if components not in (("FULL", MAMBA), ("FULL", SWA, MAMBA)):
            raise ValueError(f"kvstate models tree_components (FULL, MAMBA) and (FULL, SWA, "
                             f"MAMBA), got {components}")
        pool, allocator = params.req_to_token_pool, params.token_to_kv_pool_allocator
        has_swa = SWA in components
        wanted = SWATokenToKVPoolAllocator if has_swa else TokenToKVPoolAllocator
        if not isinstance(pool, HybridReqToTokenPool) or not isinstance(allocator, wanted):
            raise TypeError(f"a {components} tree needs a HybridReqToTokenPool and a kvstate "
                            f"{wanted.__name__}")
        page = as_int(params.page_size, "page_size", low=1)
        if allocator.page_size != page or pool.engine is not allocator.engine:
            raise ValueError("the pool and the allocator must share one engine and page size")
        window = getattr(params, "sliding_window_size", None) if has_swa else None
        if has_swa and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
            raise ValueError("an SWA tree needs a positive sliding_window_size")
        if getattr(params, "eviction_policy", "lru").lower() != "lru":
            raise ValueError("kvstate's hybrid tree evicts by LRU only (0.5.23's default)")
        self.disable = bool(getattr(params, "disable", False))
        extra = bool(getattr(params, "enable_mamba_extra_buffer", False))
        if not extra and page != 1 and not self.disable:
            raise ValueError("without the extra buffer a Mamba tree needs page_size 1")
        if extra != pool.enable_mamba_extra_buffer:
            raise ValueError("the pool and the tree disagree on enable_mamba_extra_buffer")
        chunk = as_int(getattr(params, "mamba_chunk_size", FLA_CHUNK_SIZE), "mamba_chunk_size",
                       low=1)
        interval = as_int(getattr(params, "mamba_track_interval", MAMBA_TRACK_INTERVAL),
                          "mamba_track_interval", low=1)
        self.req_to_token_pool, self.token_to_kv_pool_allocator = pool, allocator
        self.page_size, self.engine = page, allocator.engine
        self.sliding_window_size = self.swa_retain_window = window  # type: ignore[assignment]
        self.swa_window: int | None = window
        self.enable_mamba_extra_buffer = extra
        self.mamba_chunk_size = chunk  # the model's recurrent chunk (snapshots fall on it)
        self.mamba_cache_chunk_size = max(chunk, page)
        self.mamba_checkpoint_grid = math.lcm(self.mamba_cache_chunk_size, page)
        self.mamba_track_grid = math.lcm(self.mamba_checkpoint_grid, interval)
        self._at_head = page > 1  # paged frees go to the head, token frees to the tail

    # -- capabilities and sizes ------------------------------------------------------------
    def supports_swa(self) -> bool:
        return self.swa_window is not None

    def supports_mamba(self) -> bool:
        return True

    def swa_evictable_size(self) -> int:
        return 0 if not self.supports_swa() else super().swa_evictable_size()

    def swa_protected_size(self) -> int:
        return 0 if not self.supports_swa() else super().swa_protected_size()

    def mamba_evictable_size(self) -> int:
        return int(self.engine.view.mamba.evictable)

    def mamba_protected_size(self) -> int:
        return int(self.engine.view.mamba.protected)

    def total_size(self) -> tuple[int, ...]:  # type: ignore[override]
        """Tokens of FULL (and SWA) and states of Mamba held by the tree, in tree order."""
        view = self.engine.view
        sizes = [int(view.evictable_size + view.protected_size)]
        if self.supports_swa():
            sizes.append(int(view.swa.evictable + view.swa.protected))
        return (*sizes, int(view.mamba.evictable + view.mamba.protected))

    # -- tree calls ------------------------------------------------------------------
    def match_prefix(self, params: Any) -> MatchResult:
        """See the module docstring; ``MemoryError`` (after the eviction it tried) when the
        copy-on-match finds no slot."""
        tokens = token_ids(params.key)
        if self.disable:
            return MatchResult(0, self.root_node, self.root_node, self.root_node)
        cow, req = bool(getattr(params, "cow_mamba", False)), getattr(params, "req", None)
        held = 0
        if cow:
            if req is None:
                raise ValueError("cow_mamba needs the request (MatchPrefixParams.req)")
            held = req.kv.mamba_pool_idx or 0
            if held and held not in self.engine.view.mamba.held:
                raise ValueError(f"{req!r}'s Mamba slot {held} is not held")
        window = self.swa_window
        with self.engine.batch() as batch:
            found = plan_mamba_match(batch, tokens, grid=self.mamba_checkpoint_grid, window=window)
            slot = (plan_copy_on_match(batch, found, held, at_head=self._at_head, window=window)
                    if cow else 0)
            # Inside the batch: a listener failing at the commit raises after the copy.
            if cow and req is not None and found.state and slot:
                req.kv.mamba_pool_idx, req.kv.mamba_cow_src_index = slot, found.state
        if cow and found.state and not slot:  # raised after the batch: the eviction it tried stays
            raise MemoryError("no Mamba slot for the copy-on-match, even after eviction")
        self._matched_path = (found.last_node, self.engine.view.seq, found.pages)
        node = TreeNode(self, found.last_node)
        return MatchResult(found.length, node, node, node,
                           swa_branching_seqlen=found.swa_branching_seqlen,
                           mamba_branching_seqlen=found.mamba_branching_seqlen,
                           full_kv_hit_length=found.full_hit)

    def insert(self, params: Any) -> InsertResult:
        """Insert ``params.key`` -> ``params.value`` (FULL slots of whole pages, from
        ``prev_prefix_len`` on held by one owner) with the state ``params.mamba_value`` (a
        held slot) at its end."""
        if self.disable:
            return InsertResult(prefix_len=0)
        if getattr(params, "mamba_value", None) is None:
            raise ValueError("an insert into a Mamba tree needs mamba_value (a held slot)")
        slot_list = int_list(params.mamba_value, "mamba_value", low=1)
        if len(slot_list) != 1 or slot_list[0] not in self.engine.view.mamba.held:
            raise ValueError(f"mamba_value {slot_list} is not one held Mamba slot")
        tokens = token_ids(params.key)
        size = self.page_size
        aligned = len(tokens) // size * size
        slots = int_list(params.value, "insert value")
        if len(slots) < aligned:
            raise ValueError(f"insert value has {len(slots)} slots for a {aligned}-token key")
        pages = pages_of(slots[:aligned], size)
        prev = as_int(getattr(params, "prev_prefix_len", 0) or 0, "prev_prefix_len")
        owner = self._owner(pages[min(prev, aligned) // size:], slots[:aligned])
        getter = getattr(params, "get_evicted_seqlen", None)
        cursor = as_int(getter(SWA), "SWA evicted seqlen") if self.supports_swa() and getter else 0
        spec = MambaInsertSpec(self.swa_window, prev, cursor, self._at_head)
        with self.engine.batch() as batch:
            done = plan_mamba_insert(batch, tokens, pages, owner, slot_list[0], spec)
        return InsertResult(prefix_len=done.prefix_len,
                            last_device_node=TreeNode(self, done.last_node),
                            mamba_exist=done.mamba_exist)

    def evict(self, params: Any) -> EvictResult:
        """Evict toward ``num_tokens`` FULL, ``swa_num_tokens`` SWA tokens, ``mamba_num``
        states."""
        counts = self._counts(params)
        if self.disable or not any(counts):
            return EvictResult()
        with self.engine.batch() as batch:
            done = plan_mamba_evict(batch, *counts, at_head=self._at_head)
        return EvictResult(done.full, done.swa, done.mamba)

    def evict_for_alloc(self, params: Any) -> EvictResult:
        """Evict until each pool has its shortfall free (counts are shortfalls)."""
        counts = self._counts(params)
        if self.disable or not any(counts):
            return EvictResult()
        with self.engine.batch() as batch:
            done = plan_mamba_evict_for_alloc(batch, *counts, at_head=self._at_head)
        return EvictResult(done.full, done.swa, done.mamba)

    def _counts(self, params: Any) -> tuple[int, int, int]:
        return (as_int(getattr(params, "num_tokens", 0), "num_tokens"),
                as_int(getattr(params, "swa_num_tokens", 0), "swa_num_tokens"),
                as_int(getattr(params, "mamba_num", 0), "mamba_num"))

    # -- locks ------------------------------------------------------------------------
    def lock(self, node: Any, skip_lock_components: Any = ()) -> MambaTreeLock:
        """Lock ``node``'s FULL path, SWA window and Mamba state.  Commits ``Lock``,
        ``SwaLock``, ``MambaLock``."""
        if skip_lock_components:
            raise ValueError("kvstate's hybrid locks take every component")
        node_id = self._node_id(node)
        receipt = MambaReceipt(ROOT)
        if not self.disable and node_id != ROOT:
            with self.engine.batch() as batch:
                receipt = plan_mamba_lock(batch, node_id, window=self.swa_window)
        return self.make_lock(receipt)

    def make_lock(self, receipt: MambaReceipt) -> MambaTreeLock:
        """The ``TreeLock`` form of a planner receipt (0.5.23 records None for a root
        window)."""
        uuids = {SWA: receipt.uuid or None} if self.supports_swa() else {}
        return MambaTreeLock(TreeNode(self, receipt.node), HybridReceipt(receipt.node, uuids),
                             mamba_locked=receipt.mamba, has_swa=self.supports_swa())

    def unlock(self, lock: HybridLock | None) -> None:
        """Release ``lock``.  Commits ``MambaUnlock``, ``SwaUnlock`` (those still held),
        ``Unlock``."""
        if lock is None or self.disable:
            return
        receipt = self._receipt(lock)
        if lock.released:
            raise ValueError("this lock was already unlocked")
        with self.engine.batch() as batch:
            if receipt.node != ROOT:
                plan_mamba_unlock(batch, receipt)
            lock.released = True  # inside the batch: a listener may fail at its commit

    def release_swa(self, lock: HybridLock | None) -> None:
        """Release the SWA window of ``lock`` early, once, with its Mamba lock (below SWA in
        eviction priority).  Commits ``SwaUnlock``, ``MambaUnlock``."""
        if self.disable or lock is None or lock.swa_released:
            return
        receipt = self._receipt(lock)
        with self.engine.batch() as batch:
            if receipt.swa:
                plan_mamba_release_swa(batch, receipt)
            lock.swa_released = True  # inside the batch: a listener may fail at its commit

    def _receipt(self, lock: Any) -> MambaReceipt:
        if not isinstance(lock, MambaTreeLock):
            raise TypeError(f"{lock!r} is not a lock of a Mamba tree")
        return lock.mamba_receipt()


__all__ = ["MambaCacheInitParams", "MambaTreeLock", "MambaUnifiedRadixCache"]
