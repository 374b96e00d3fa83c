"""``RadixCache``: SGLang's radix prefix cache, every call a planner decision.

Node handles (``TreeNode``) name a core node id and read the current state,
so a handle taken before a split stays valid: the split keeps the bottom half
under the old id.  Returns follow SGLang: ``match_prefix`` gives an int64
slot tensor and the last node, ``insert`` the length already present, the
lock calls minus/plus the tokens moved between evictable and protected.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvstate.engine import Engine
from kvstate.events import Allocate, Lock, Reset, Unlock
from kvstate.log.inspect import show_tree
from kvstate.planner import plan_evict, plan_insert, plan_match
from kvstate.planner.builder import PlanBuilder
from kvstate.planner.requests import RequestCursor, plan_checkpoint, plan_release
from kvstate.planner.tree_ops import prefix_length
from kvstate.sglang.allocator import TokenToKVPoolAllocator
from kvstate.sglang.binding import FrontEndMixin
from kvstate.sglang.pool import ReqToTokenPool
from kvstate.sglang.req import Req
from kvstate.sglang.tree_view import TreeNode
from kvstate.state import DETACHED, ROOT

_EMPTY = torch.empty((0,), dtype=torch.int64)


class RadixCache(FrontEndMixin):
    def __init__(self, req_to_token_pool: ReqToTokenPool,
                 token_to_kv_pool_allocator: TokenToKVPoolAllocator,
                 page_size: int = 1, disable: bool = False, *, engine: Engine | None = None) -> None:
        if token_to_kv_pool_allocator.page_size != page_size:
            raise ValueError(f"page_size {page_size} differs from the allocator's "
                             f"{token_to_kv_pool_allocator.page_size}")
        shared = req_to_token_pool.engine
        if token_to_kv_pool_allocator.engine is not shared or (engine is not None and engine is not shared):
            raise ValueError("the request pool and the allocator must share one engine: build the "
                             "pool, then the allocator, or pass the same engine= to both")
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = page_size
        self.disable = disable
        self.engine = shared

    # -- structure ------------------------------------------------------------
    @property
    def root_node(self) -> TreeNode:
        return TreeNode(self, ROOT)

    def reset(self) -> None:
        self.engine.apply(Reset("tree"))

    def match_prefix(self, key: Sequence[int]) -> tuple[torch.Tensor, TreeNode]:
        if self.disable:
            return _EMPTY.clone(), self.root_node
        result = self.engine.commit(plan_match(self.engine.state, [int(t) for t in key]))
        return torch.tensor(result.slots, dtype=torch.int64), TreeNode(self, result.last_node)

    def insert(self, key: Sequence[int], value: Any = None) -> int:
        """Insert page-aligned ``key -> value``; returns the length already present.

        With ``value=None`` kvstate allocates real slots for the new part
        (SGLang would store the token ids themselves as fake slots).
        """
        if self.disable:
            return 0
        tokens = [int(t) for t in key]
        aligned = len(tokens) // self.page_size * self.page_size
        tokens = tokens[:aligned]
        state = self.engine.state
        builder = PlanBuilder(state)
        if value is None:
            present = prefix_length(state, tokens)
            new_pages = (aligned - present) // self.page_size
            if new_pages > len(state.free_pages):
                raise MemoryError(f"insert needs {new_pages} free pages for its values, "
                                  f"{len(state.free_pages)} are free")
            pages = state.free_pages.head(new_pages)
            if pages:
                builder.emit(Allocate(tuple(pages)))
            size = self.page_size
            slots = [0] * present + [p * size + k for p in pages for k in range(size)]
            owner: Any = DETACHED
        else:
            slots = [int(v) for v in torch.as_tensor(value).reshape(-1).tolist()][:aligned]
            owner = self._owner_of(slots, prefix_length(state, tokens))
        result = builder.extend(plan_insert(builder.state, tokens, slots, owner))
        self.engine.commit(builder.done(None))
        return int(result.prefix_len)

    def _owner_of(self, slots: list[int], present: int) -> Any:
        if present >= len(slots):
            return DETACHED
        held = self.engine.state.holders.get(slots[present] // self.page_size, ())
        return held[0] if len(held) == 1 else DETACHED

    def evict(self, num_tokens: int) -> int:
        if self.disable or num_tokens <= 0:
            return 0
        plan = plan_evict(self.engine.state, num_tokens, at_head=self.page_size > 1)
        return int(self.engine.commit(plan))

    def inc_lock_ref(self, node: TreeNode) -> int:
        return self._lock(node, Lock)

    def dec_lock_ref(self, node: TreeNode) -> int:
        return self._lock(node, Unlock)

    def _lock(self, node: TreeNode | None, event_type: type[Lock] | type[Unlock]) -> int:
        if self.disable or node is None or node.id == ROOT:
            return 0
        before = self.engine.state.evictable_size
        self.engine.apply(event_type(node.id))
        return self.engine.state.evictable_size - before

    def evictable_size(self) -> int:
        return self.engine.state.evictable_size

    def protected_size(self) -> int:
        return self.engine.state.protected_size

    def total_size(self) -> int:
        return self.engine.state.total_size()

    def pretty_print(self) -> None:
        print(show_tree(self.engine.state))
        print(f"#tokens: {self.total_size()}")

    # -- request flows -----------------------------------------------------------
    def cache_finished_req(self, req: Req) -> None:
        """Cache ``(input + output)[:-1]`` (the last token has no KV), free the rest and the row."""
        row = self._row(req)
        token_ids = (req.origin_input_ids + req.output_ids)[:-1]
        plan = plan_release(self.engine.state, self._cursor(req, row), token_ids,
                            prompt_len=len(req.origin_input_ids), owned=len(token_ids),
                            checkpoint=not self.disable, at_head=self.page_size > 1)
        self.engine.commit(plan)
        req.req_pool_idx = None

    def cache_unfinished_req(self, req: Req) -> None:
        """Publish ``fill_ids`` so far and rebind the row to the canonical tree slots."""
        row = self._row(req)
        if self.disable:
            return
        fill = req.fill_ids[: self.engine.state.requests[row].allocated]
        plan = plan_checkpoint(self.engine.state, self._cursor(req, row), fill,
                               prompt_len=len(req.origin_input_ids), up_to=len(fill),
                               at_head=self.page_size > 1)
        cursor = self.engine.commit(plan)
        state = self.engine.state
        req.prefix_indices = torch.tensor(state.slots_of(row, 0, len(fill)), dtype=torch.int64)
        req.last_node = TreeNode(self, cursor.last_node)
        req.cache_protected_len = cursor.protected_len

    def _row(self, req: Req) -> int:
        if req.req_pool_idx is None:
            raise ValueError(f"{req!r} holds no request row")
        return int(req.req_pool_idx)

    def _cursor(self, req: Req, row: int) -> RequestCursor:
        protected = req.cache_protected_len or len(req.prefix_indices)
        protected = protected // self.page_size * self.page_size
        last = req.last_node.id if isinstance(req.last_node, TreeNode) else ROOT
        return RequestCursor(row, protected, last)


__all__ = ["RadixCache", "TreeNode"]


