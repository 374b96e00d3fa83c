"""The request-level flows of ``RadixCache`` (a mixin): finish, checkpoint, free a row's KV.

``cache_finished_req`` / ``cache_unfinished_req`` keep the seed-000 names
with 0.5.23's semantics; ``checkpoint(req, up_to=)`` and ``free_kv_row`` are
0.5.23's own calls (its scheduler finishes a request with ``checkpoint``,
``free_kv_row``, ``unlock`` and ``ReqToTokenPool.free``).  Each flow checks
the request against the state before it emits anything (row open, lengths,
lock, no dangling entries), so a bad ``Req`` is refused with nothing changed
instead of failing half-way through a batch.
"""

from __future__ import annotations

from typing import Any

import torch

from kvstate.engine import Engine
from kvstate.planner.requests import RequestCursor, plan_checkpoint, plan_release
from kvstate.sglang.inputs import as_int, token_ids
from kvstate.sglang.params import DecLockRefParams, TreeLock
from kvstate.sglang.tree_view import TreeNode
from kvstate.state import ROOT, slots_of


class RequestFlows:
    """Request flows over the shared engine; ``RadixCache`` provides the attributes below."""

    engine: Engine
    page_size: int
    disable: bool
    req_to_token_pool: Any
    token_to_kv_pool_allocator: Any
    _at_head: bool

    def cache_finished_req(self, req: Any, is_insert: bool = True) -> None:
        """Cache ``(input + output)[:-1]`` (the last token has no KV), free the rest, close the row.

        Commits the checkpoint's ``Touch``/``Split``/``Insert``/``Assign``/
        ``Free``/``Lock``/``Unlock`` (unless ``is_insert`` is False or the
        cache is disabled), then ``ReqFree``, ``Free`` of what the request
        still owns, and ``Unlock``.
        """
        tokens = token_ids(req.origin_input_ids + req.output_ids)[:-1]
        cursor = self._cursor(req, len(tokens))
        with self.engine.batch() as batch:
            plan_release(batch, cursor, tokens, prompt_len=len(req.origin_input_ids),
                         owned=len(tokens), checkpoint=bool(is_insert) and not self.disable,
                         at_head=self._at_head)
            # The request's fields change inside the batch: a listener failing at the commit
            # raises after the events are applied, and the fields must follow them.
            req.req_pool_idx = None
            req.lock = None

    def cache_unfinished_req(self, req: Any, chunked: bool = False) -> None:
        """Publish ``fill_ids`` so far and rebind the row to the canonical tree slots.

        Commits what ``checkpoint`` commits; sets ``prefix_indices`` to the
        row's slots (tree part plus the request's own partial page).
        """
        if self.disable:
            self._open_record(req)
            return
        allocated = self._open_record(req).allocated
        fill = token_ids(req.fill_ids[:allocated])
        cursor = self._cursor(req, len(fill))
        with self.engine.batch() as batch:
            moved = plan_checkpoint(batch, cursor, fill, prompt_len=len(req.origin_input_ids),
                                    up_to=len(fill), at_head=self._at_head)
            self._rebind(req, moved)  # inside the batch: see ``cache_finished_req``
            req.prefix_indices = torch.tensor(slots_of(batch.state, cursor.request, 0, len(fill)),
                                              dtype=torch.int64)

    def checkpoint(self, req: Any, *, up_to: int) -> None:
        """0.5.23's checkpoint: insert the row's first ``up_to`` tokens, free the duplicates,
        repoint the row at the tree's copy, move the lock to the new last node.

        Commits ``Touch``/``Split``/``Insert`` (the insert and the split at the
        prompt boundary), the re-match's ``Touch``/``Split``, ``Assign``,
        ``Free`` of the duplicates, ``Unlock``/``Lock``.  Frees nothing the
        request owns past the tree part: ``free_kv_row`` does.
        """
        if self.disable:
            return
        count = as_int(up_to, "up_to")
        tokens = token_ids(req.origin_input_ids + req.output_ids)[:count]
        if len(tokens) < count:
            raise ValueError(f"{req!r} has {len(tokens)} tokens, fewer than up_to={count}")
        cursor = self._cursor(req, count)
        with self.engine.batch() as batch:
            moved = plan_checkpoint(batch, cursor, tokens, prompt_len=len(req.origin_input_ids),
                                    up_to=count, at_head=self._at_head)
            self._rebind(req, moved)  # inside the batch: see ``cache_finished_req``

    def free_kv_row(self, req: Any, ranges: list[tuple[int, int]]) -> None:
        """Free ascending, disjoint row-position ranges ``[start, end)`` of ``req``'s row.

        Goes through the allocator's ``free_segments`` (one batch): pages the
        row still maps are freed with ``FreeMapped`` and become dangling
        entries until the row is rewritten or freed.  Ranges past the row's
        mapped length are refused.
        """
        record = self._open_record(req)
        row = int(req.req_pool_idx)
        merged: list[tuple[int, int]] = []
        for start, end in ranges:
            start, end = as_int(start, "range start"), as_int(end, "range end")
            if not start <= end <= record.allocated:
                raise ValueError(f"range [{start}, {end}) is not inside the row's "
                                 f"{record.allocated} mapped positions")
            if merged and start < merged[-1][1]:
                raise ValueError("free_kv_row ranges must be ascending and disjoint")
            if merged and start == merged[-1][1]:
                merged[-1] = (merged[-1][0], end)  # one page split between two ranges: free it once
            else:
                merged.append((start, end))
        view = self.engine.view
        segments = [(slots_of(view, row, start, end), start) for start, end in merged if end > start]
        self.token_to_kv_pool_allocator.free_segments(segments)

    # -- checks and bookkeeping ------------------------------------------------------------
    def _open_record(self, req: Any) -> Any:
        row = req.req_pool_idx
        if row is None:
            raise ValueError(f"{req!r} holds no request row")
        record = self.engine.view.requests.get(row) if isinstance(row, int) else None
        if record is None:
            raise ValueError(f"row {row!r} of {req!r} is not allocated")
        return record

    def _cursor(self, req: Any, owned: int) -> RequestCursor:
        """The request as the planner sees it, after checking it against the state."""
        record = self._open_record(req)
        view, size = self.engine.view, self.page_size
        if owned > record.allocated:
            raise ValueError(f"{req!r} would cache {owned} tokens but its row maps only "
                             f"{record.allocated}")
        if record.dangling:
            raise ValueError(f"{req!r}'s row still maps freed pages (table indices "
                             f"{list(record.dangling)[:8]}); rewrite or free those positions first")
        protected = (req.cache_protected_len or len(req.prefix_indices)) // size * size
        if protected > record.allocated or (
                protected and record.pages[protected // size - 1] not in view.page_node):
            raise ValueError(f"{req!r}: cache_protected_len {protected} is not a tree prefix of its row")
        lock = req.lock.node if getattr(req, "lock", None) is not None else req.last_node
        node_id = lock.id if isinstance(lock, TreeNode) else ROOT
        if node_id != ROOT:
            node = view.nodes.get(node_id)
            if node is None:
                raise ValueError(f"{req!r}'s locked node {node_id} has been evicted")
            if node.lock_ref - node.below <= 0:
                raise ValueError(f"{req!r} holds no lock on node {node_id}")
        return RequestCursor(int(req.req_pool_idx), protected, node_id)

    def _rebind(self, req: Any, cursor: RequestCursor) -> None:
        node = TreeNode(self, cursor.last_node)
        req.cache_protected_len = cursor.protected_len
        req.last_node = node
        req.lock = TreeLock(node, DecLockRefParams(node_id=cursor.last_node))


__all__ = ["RequestFlows"]
