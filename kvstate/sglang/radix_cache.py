"""``RadixCache``: SGLang's radix prefix cache, every call a planner decision.

Node handles (``TreeNode``) name a core node id and read the current state,
so a handle taken before a split stays valid.  Each call takes SGLang
0.5.23's parameter form and returns its result object
(``match_prefix(MatchPrefixParams(key=RadixKey(...))) -> MatchResult``,
``insert(InsertParams) -> InsertResult``, ``evict(EvictParams) ->
EvictResult``), or the plain seed-000 form: ``match_prefix(key) ->
(int64 slots, last node)``, ``insert(key, value) -> int`` (the length
already present), ``evict(n) -> int``.  The lock calls return 0.5.23's
``IncLockRefResult`` / ``DecLockRefResult`` (``delta``: tokens moved into
evictable).  The request flows are in ``kvstate.sglang.flows``.
"""

from __future__ import annotations

from typing import Any

import torch

from kvstate.engine import Engine
from kvstate.errors import OutOfMemory
from kvstate.events import Allocate, Lock, Reset, Unlock
from kvstate.planner import plan_evict, plan_insert, plan_match
from kvstate.planner.evict import fifo_priority, lru_priority
from kvstate.planner.tree_ops import MatchResult as PlannedMatch
from kvstate.planner.tree_ops import prefix_length
from kvstate.sglang.allocator import TokenToKVPoolAllocator
from kvstate.sglang.binding import FrontEndMixin
from kvstate.sglang.flows import RequestFlows
from kvstate.sglang.inputs import as_int, int_list, is_params, token_ids
from kvstate.sglang.params import (
    CacheInitParams,
    DecLockRefResult,
    EvictResult,
    IncLockRefResult,
    InsertResult,
    MatchResult,
    TreeLock,
)
from kvstate.sglang.pool import ReqToTokenPool
from kvstate.sglang.tree_view import TreeNode
from kvstate.state import DETACHED, ROOT, expand_pages, pages_of, path_to_root

_POLICIES = {"lru": lru_priority, "fifo": fifo_priority}
_NO_MATCH = PlannedMatch((), ROOT, 0)


class RadixCache(RequestFlows, FrontEndMixin):
    def __init__(self, req_to_token_pool: ReqToTokenPool | CacheInitParams,
                 token_to_kv_pool_allocator: TokenToKVPoolAllocator | None = None,
                 page_size: int = 1, disable: bool = False, *, eviction_policy: str = "lru",
                 engine: Engine | None = None) -> None:
        """``RadixCache(pool, allocator, page_size)`` or 0.5.23's ``RadixCache(CacheInitParams(...))``."""
        if isinstance(req_to_token_pool, CacheInitParams):
            params = req_to_token_pool
            req_to_token_pool, token_to_kv_pool_allocator = (params.req_to_token_pool,
                                                             params.token_to_kv_pool_allocator)
            page_size, disable, eviction_policy = params.page_size, params.disable, params.eviction_policy
        if not isinstance(req_to_token_pool, ReqToTokenPool) or not isinstance(
                token_to_kv_pool_allocator, TokenToKVPoolAllocator):
            raise TypeError("RadixCache needs a ReqToTokenPool and a kvstate allocator")
        if token_to_kv_pool_allocator.page_size != page_size:
            raise ValueError(f"page_size {page_size} differs from the allocator's "
                             f"{token_to_kv_pool_allocator.page_size}")
        if eviction_policy.lower() not in _POLICIES:
            raise ValueError(f"eviction_policy must be one of {sorted(_POLICIES)}, got "
                             f"{eviction_policy!r}")
        shared = req_to_token_pool.engine
        if token_to_kv_pool_allocator.engine is not shared or (engine is not None and engine is not shared):
            raise ValueError("the request pool and the allocator must share one engine: build the "
                             "pool, then the allocator, or pass the same engine= to both")
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = page_size
        self.disable = disable
        self.eviction_policy = eviction_policy.lower()
        self._priority = _POLICIES[self.eviction_policy]
        self._at_head = page_size > 1  # paged frees go back at the head, token frees at the tail
        self.engine = shared

    # -- structure ------------------------------------------------------------
    @property
    def root_node(self) -> TreeNode:
        return TreeNode(self, ROOT)

    def reset(self) -> None:
        """Drop the tree; its pages nobody else holds go back free.  Commits ``Reset("tree")``."""
        with self.engine.batch() as batch:
            batch.emit(Reset("tree"))

    def supports_prefix_sharing(self) -> bool:
        return not self.disable

    def match_prefix(self, key: Any) -> Any:
        """Longest cached page-aligned prefix; commits ``Touch`` and at most one ``Split``.

        ``MatchPrefixParams`` -> ``MatchResult`` (matched slots:
        ``path_device_indices(result.last_device_node)``); a plain key ->
        ``(int64 slot tensor, last node)``.  No events when disabled or when
        the key is shorter than a page.
        """
        if is_params(key, "key"):
            result = self._match(token_ids(key.key))
            node = TreeNode(self, result.last_node)
            return MatchResult(result.length, node, node, node)
        result = self._match(token_ids(key))
        return torch.tensor(result.slots, dtype=torch.int64), TreeNode(self, result.last_node)

    def _match(self, tokens: tuple[int, ...]) -> PlannedMatch:
        if self.disable or len(tokens) < self.page_size:
            return _NO_MATCH
        with self.engine.batch() as batch:
            return plan_match(batch, tokens)

    def insert(self, key: Any, value: Any = None) -> Any:
        """Insert page-aligned ``key -> value``; commits ``Touch``, ``Split``, ``Insert``.

        ``InsertParams`` -> ``InsertResult``; a plain key -> the length
        already present (the caller's copies of that part are duplicates).
        ``value=None`` allocates real slots for the new part first
        (``Allocate``; SGLang would store the token ids as fake slots).
        A value's new pages must be held by one owner (a bare allocation or
        one request's row), whose holds move to the tree.
        """
        if is_params(key, "key"):
            prefix, last = self._insert(token_ids(key.key), key.value)
            return InsertResult(prefix_len=prefix, last_device_node=TreeNode(self, last))
        return self._insert(token_ids(key), value)[0]

    def _insert(self, tokens: tuple[int, ...], value: Any) -> tuple[int, int]:
        if self.disable:
            return 0, ROOT
        size = self.page_size
        aligned = len(tokens) // size * size
        tokens = tokens[:aligned]
        view = self.engine.view
        present = prefix_length(view, tokens)
        if value is None:
            new_pages = (aligned - present) // size
            if new_pages > len(view.free_pages):
                raise OutOfMemory(new_pages, len(view.free_pages), "pages")
            with self.engine.batch() as batch:
                pages = view.free_pages.head(new_pages)
                if pages:
                    batch.emit(Allocate(tuple(pages)))
                slots = [0] * present + list(expand_pages(pages, size))
                result = plan_insert(batch, tokens, slots, DETACHED)
            return result.prefix_len, result.last_node
        slots = int_list(value, "insert value")
        if len(slots) < aligned:
            raise ValueError(f"insert value has {len(slots)} slots for a {aligned}-token key")
        slots = slots[:aligned]
        owner = self._owner_of(view, slots[present:], present)
        with self.engine.batch() as batch:
            result = plan_insert(batch, tokens, slots, owner)
        return result.prefix_len, result.last_node

    def _owner_of(self, view: Any, new: list[int], start: int) -> Any:
        """Who holds every page of the new part (checked before any event is emitted)."""
        if not new:
            return DETACHED
        size = self.page_size
        pages = pages_of(new, size)
        if size > 1 and (expand_pages(pages, size) != tuple(new) or start % size):
            raise ValueError(f"insert value slots {new[:8]}... are not whole pages in key order")
        if len(set(pages)) != len(pages):
            raise ValueError("insert value maps one page twice")
        held = view.holders.get(pages[0])
        for page in pages:
            if page in view.page_node:
                raise ValueError(f"insert value page {page} is already in tree node "
                                 f"{view.page_node[page]}")
            if held is None or len(held) != 1 or view.holders.get(page) != held:
                raise ValueError(f"insert value page {page} is not held by one owner alone "
                                 f"(holders {list(view.holders.get(page, ()))})")
        return held[0]

    def evict(self, num_tokens: Any) -> Any:
        """Evict whole unlocked leaves (LRU by default) until ``num_tokens`` are covered.

        Commits ``Evict``.  ``EvictParams`` -> ``EvictResult``; an int -> the
        tokens evicted (may overshoot: whole nodes go).
        """
        if is_params(num_tokens, "num_tokens"):
            return EvictResult(num_tokens_evicted=self._evict(num_tokens.num_tokens))
        return self._evict(num_tokens)

    def _evict(self, num_tokens: Any) -> int:
        count = as_int(num_tokens, "num_tokens")
        if self.disable or count == 0:
            return 0
        with self.engine.batch() as batch:
            return plan_evict(batch, count, at_head=self._at_head, priority=self._priority)

    # -- locks ----------------------------------------------------------------------
    def inc_lock_ref(self, node: TreeNode | None) -> IncLockRefResult:
        """Lock ``node`` and its ancestors; commits ``Lock`` (nothing for the root)."""
        node_id = self._node_id(node)
        return IncLockRefResult(delta=self._lock(node_id, Lock), node_id=node_id)

    def dec_lock_ref(self, node: TreeNode | None, params: Any = None) -> DecLockRefResult:
        """Unlock ``node`` and its ancestors; commits ``Unlock`` (nothing for the root)."""
        return DecLockRefResult(delta=self._lock(self._node_id(node), Unlock))

    def lock(self, node: TreeNode | None) -> TreeLock:
        """0.5.23's lock for one holder: ``inc_lock_ref`` and its receipt.  Commits ``Lock``."""
        handle = node if node is not None else self.root_node
        return TreeLock(handle, self.inc_lock_ref(handle).to_dec_params())

    def unlock(self, lock: TreeLock | None) -> None:
        """Release a ``lock`` (``None``: nothing).  Commits ``Unlock``."""
        if lock is not None:
            self.dec_lock_ref(lock.node, lock.receipt)

    def _node_id(self, node: TreeNode | None) -> int:
        if node is None:
            return ROOT
        if not isinstance(node, TreeNode) or node._cache is not self:
            raise TypeError(f"{node!r} is not a node of this cache")
        return as_int(node.id, "tree node id")  # a node's id goes into events as it is

    def _lock(self, node_id: int, event_type: type[Lock] | type[Unlock]) -> int:
        if self.disable or node_id == ROOT:
            return 0
        before = self.engine.view.evictable_size
        self.engine.commit_events((event_type(node_id),))
        return int(self.engine.view.evictable_size - before)

    # -- sizes and reads -------------------------------------------------------------------
    def evictable_size(self) -> int:
        return int(self.engine.view.evictable_size)

    def protected_size(self) -> int:
        return int(self.engine.view.protected_size)

    def total_size(self) -> int:
        view = self.engine.view
        return int(view.evictable_size + view.protected_size)

    def path_device_indices(self, node: TreeNode | None) -> torch.Tensor:
        """The slots on the path from the root to ``node`` (int64), as 0.5.23 reads a match."""
        nodes = self.engine.view.nodes
        path = list(path_to_root(nodes, self._node_id(node)))
        pages = [page for node_id in reversed(path) for page in nodes[node_id].pages]
        return torch.tensor(expand_pages(pages, self.page_size), dtype=torch.int64)

    def pretty_print(self) -> None:
        from kvstate.display import show_tree

        print(show_tree(self.engine.state))
        print(f"#tokens: {self.total_size()}")


__all__ = ["RadixCache", "TreeNode"]
