"""The request flows of ``UnifiedRadixCache(FULL, SWA)`` (a mixin), with 0.5.23's call forms.

* ``checkpoint(req, up_to=)`` (``checkpoint_into_tree``): an unfinished request
  first frees its out-of-window SWA (``SwaFree``); then the insert's events,
  an ``Assign`` rewriting the row onto the tree's slots, and the lock moved
  (``SwaUnlock``, ``Unlock``, ``Lock``, ``SwaLock``).
* ``release_kv_cache(req, checkpoint=True)`` (0.5.23's ``common.release_kv_cache``):
  the finishing checkpoint, ``free_kv_row`` of what the request still owns
  (FULL-only where its SWA is gone), the unlock, then ``ReqFree``.
* ``evict_sliding_windows(req, pre_len, eviction_interval=)`` and the decode
  branch of ``ScheduleBatch.maybe_evict_swa`` (``maybe_evict_swa(reqs)``):
  the out-of-window SWA frees, through the allocator's ``free_swa_segment``
  (so a free group parks them).
* ``alloc_for_decode(reqs, eviction_interval=)``: one decode step's KV as one
  decision (``kvstate.planner.swa_decode``): ``SwaFree`` of the due windows,
  each pool's shortfall evicted, ``Allocate(pages, items)`` writing each
  request's slot into its row and ``SwaAlloc`` pairing the fresh pages.  The
  requests' lengths stay the scheduler's to move.
* ``alloc_for_extend(req, end, prefix_len=)``: a prefill chunk's KV as one
  decision (``plan_extend_step``): each pool's shortfall evicted, the hit's
  slots written at admission, and ``Allocate(pages, ((row, slots),))``
  appending the chunk to the row (``SwaAlloc`` pairing the fresh pages).

Each flow reads the request (``kvstate.sglang.hybrid_req.HybridReq``) into a
``HybridCursor``, plans, and writes the new cursor back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvstate.engine import Engine
from kvstate.errors import ListenerError
from kvstate.planner.swa_decode import DecodeStep, Evictor, plan_decode_step, plan_extend_step
from kvstate.planner.swa_evict import plan_evict_for_alloc
from kvstate.planner.swa_match import path_slots
from kvstate.planner.swa_requests import (
    HybridCursor,
    out_of_window,
    plan_free_row,
    plan_hybrid_checkpoint,
    plan_hybrid_release,
)
from kvstate.sglang.hybrid_req import SWA, HybridLock, HybridReceipt
from kvstate.sglang.inputs import as_int, row_ranges
from kvstate.sglang.tree_view import TreeNode
from kvstate.state import ROOT, slots_of

SWA_EVICTION_INTERVAL = 128  # SGLANG_SWA_EVICTION_INTERVAL's default in 0.5.23


class UnifiedFlows:
    """Request flows over the shared engine; ``UnifiedRadixCache`` provides the attributes."""

    engine: Engine
    page_size: int
    disable: bool
    sliding_window_size: int
    token_to_kv_pool_allocator: Any
    _at_head: bool
    supports_swa: Callable[[], bool]
    supports_prefix_sharing: Callable[[], bool]
    _node_id: Callable[[Any], int]

    def checkpoint(self, req: Any, *, up_to: int) -> None:
        """Insert ``[cache_protected_len, up_to)`` of the request and move its lock there."""
        if self.disable:
            return
        count = as_int(up_to, "up_to")
        tokens = req.full_untruncated_fill_ids
        if count > len(tokens) or count > self._record(req).allocated:
            raise ValueError(f"{req!r} cannot checkpoint {count} tokens")
        with self.engine.batch() as batch:
            cursor, result = plan_hybrid_checkpoint(
                batch, self._cursor(req), tokens, up_to=count, finished=req.finished(),
                fill_len=len(req.get_fill_ids()), window=self.sliding_window_size,
                at_head=self._at_head)
            # The request follows the events inside the batch: a listener failing at the
            # commit raises after they are applied.
            self._write_back(req, cursor, moved=result is not None)

    def release_kv_cache(self, req: Any, *, checkpoint: bool = True) -> None:
        """Give the request's row back (with ``checkpoint``: cache what it computed first)."""
        owned = req.owned_kv_len()
        cursor = self._cursor(req)
        if owned > self._record(req).allocated:
            raise ValueError(f"{req!r} owns {owned} tokens past its row")
        if cursor.protected_len > owned:  # the tree part is a prefix of what it owns
            raise ValueError(f"{req!r} protects {cursor.protected_len} tokens, more than the "
                             f"{owned} it owns")
        do_checkpoint = checkpoint and not self.disable
        with self.engine.batch() as batch:
            cursor = plan_hybrid_release(batch, cursor, req.full_untruncated_fill_ids,
                                         owned=owned, checkpoint=do_checkpoint,
                                         window=self.sliding_window_size, at_head=self._at_head)
            if do_checkpoint:  # inside the batch: see ``checkpoint``
                req.kv.cache_protected_len = cursor.protected_len
            req.lock = None
            req.kv.req_pool_idx = None

    def free_kv_row(self, kv: Any, ranges: list[tuple[int, int]]) -> None:
        """Free ascending, disjoint row ranges of ``kv``'s row (FULL-only where its SWA
        was freed already)."""
        record = self._row(kv.req_pool_idx)
        cursor = HybridCursor(int(kv.req_pool_idx), kv.cache_protected_len,
                              evicted=kv.get_evicted_seqlen(SWA))
        merged = row_ranges(ranges, record.allocated)
        with self.engine.batch() as batch:
            for start, end in merged:
                plan_free_row(batch, cursor, start, end, at_head=self._at_head)

    def evict_sliding_windows(self, req: Any, pre_len: int, *, eviction_interval: int = 1) -> None:
        """Free the request's SWA that slid out of the window before ``pre_len``."""
        if not req.kv.holds_kv:
            return
        cursor = self._cursor(req)
        allocated = self._record(req).allocated
        pre_len = as_int(pre_len, "pre_len")
        if pre_len > allocated:  # the window ends where the row does
            raise ValueError(f"pre_len {pre_len} is past the {allocated} tokens of the row")
        moved, pages = out_of_window(self.engine.view, cursor, pre_len,
                                     window=self.sliding_window_size,
                                     interval=as_int(eviction_interval, "eviction_interval",
                                                     low=1))
        if pages:
            start = max(cursor.evicted, cursor.protected_len)  # where the freed positions begin
            slots = slots_of(self.engine.view, cursor.request, start, moved.evicted)
            try:
                self.token_to_kv_pool_allocator.free_swa_segment(slots, start_pos=start)
            except ListenerError:  # the free's own batch was applied: the cursor follows it
                req.kv.set_evicted_seqlen(SWA, moved.evicted)
                raise
        req.kv.set_evicted_seqlen(SWA, moved.evicted)

    def alloc_for_decode(self, reqs: Sequence[Any], *,
                         eviction_interval: int = SWA_EVICTION_INTERVAL) -> DecodeStep:
        """One decode step's KV for ``reqs`` as one decision (0.5.23's ``alloc_for_decode``
        as the scheduler steps it, request by request): the out-of-window SWA frees of
        ``maybe_evict_swa``, then for each request the pools' shortfall evicted and its next
        slot allocated straight into its row (``kvstate.planner.swa_decode``).  The
        requests' SWA cursors move; their lengths do not (the scheduler's).  A step that
        stops early (``DecodeStep.stopped``) keeps what it did before the request that found
        no room, as 0.5.23 does."""
        allocator, view = self.token_to_kv_pool_allocator, self.engine.view
        interval = as_int(eviction_interval, "eviction_interval", low=1)
        width = view.geometry.row_width
        rows = []
        for req in reqs:
            record = self._record(req)
            length = req.kv.kv_allocated_len
            if length != record.allocated or length >= width:
                raise ValueError(f"{req!r} cannot take position {length} of its row")
            rows.append((int(req.kv.req_pool_idx), length))
        slides: list[tuple[Any, int]] = []
        frees: list[int] = []
        if self.supports_swa():
            window, peer = self.sliding_window_size, view.swa.peer
            for req in reqs:
                due = req.seqlen - 1 - window >= req.kv.get_evicted_seqlen(SWA) + interval
                if req.decode_batch_idx >= 1 and due:
                    evicted, pages = self._window_slide(req, req.seqlen - 1, 1)
                    if any(page not in peer for page in pages):
                        raise ValueError(f"{req!r}'s out-of-window pages lost their SWA already")
                    slides.append((req, evicted))
                    frees += pages
        evict = self._decode_evictor() if self.supports_prefix_sharing() else None
        with self.engine.batch() as batch:
            step = plan_decode_step(batch, frees, rows, evict=evict, at_head=self._at_head)
            for req, evicted in slides:  # inside the batch: see ``checkpoint``
                req.kv.set_evicted_seqlen(SWA, evicted)
            if self.supports_swa():
                allocator.map_slots(batch, step.slots)
        return step

    def alloc_for_extend(self, req: Any, end: int, *, prefix_len: int | None = None
                         ) -> DecodeStep:
        """A prefill chunk's KV as one decision (0.5.23's ``alloc_for_extend`` after the
        row): each pool's shortfall evicted (a page more with pages), then row positions
        ``[kv_allocated_len, end)`` allocated straight into the row, after (at admission,
        ``prefix_len`` given) the hit's ``prefix_len`` slots.  A step that finds no room
        (``DecodeStep.stopped``) keeps its eviction, as 0.5.23 does.  The request's lengths
        stay the caller's to move."""
        view = self.engine.view
        record = self._record(req)
        start = req.kv.kv_allocated_len if prefix_len is None else as_int(prefix_len,
                                                                          "prefix_len")
        stop = as_int(end, "end", low=start, high=view.geometry.row_width)
        prefix: tuple[int, ...] = ()
        if prefix_len is None:
            if start != record.allocated:
                raise ValueError(f"{req!r} cannot extend from position {start} of its row")
        else:
            prefix = path_slots(view, self._node_id(req.last_node))[:start] if start else ()
            if record.allocated or len(prefix) != start:
                raise ValueError(f"{req!r} cannot take a {start}-token hit into its row")
        evict = self._decode_evictor() if self.supports_prefix_sharing() else None
        size = self.page_size
        with self.engine.batch() as batch:
            step = plan_extend_step(batch, int(req.kv.req_pool_idx), stop, prefix=prefix,
                                    evict=evict, headroom=0 if size == 1 else size)
            if self.supports_swa() and step.slots:
                self.token_to_kv_pool_allocator.map_slots(batch, step.slots)
        return step

    def _window_slide(self, req: Any, pre_len: int, interval: int) -> tuple[int, list[int]]:
        """The request's new SWA cursor and the pages whose SWA left the window."""
        moved, pages = out_of_window(self.engine.view, self._cursor(req), pre_len,
                                     window=self.sliding_window_size, interval=interval)
        return moved.evicted, pages

    def _decode_evictor(self) -> Evictor:
        at_head = self._at_head

        def evict(batch: Any, full: int, swa: int) -> None:
            plan_evict_for_alloc(batch, full, swa, at_head=at_head)
        return evict

    def maybe_evict_swa(self, reqs: list[Any], *,
                        eviction_interval: int = SWA_EVICTION_INTERVAL) -> None:
        """The decode branch of 0.5.23's ``ScheduleBatch.maybe_evict_swa``: in one free
        group, each request past its first decode step that has slid ``eviction_interval``
        tokens out of the window frees them."""
        allocator = self.token_to_kv_pool_allocator
        window = self.sliding_window_size
        allocator.free_group_begin()
        try:
            for req in reqs:
                due = req.seqlen - 1 - window >= req.kv.get_evicted_seqlen(SWA) + eviction_interval
                if req.decode_batch_idx >= 1 and req.kv.holds_kv and due:
                    self.evict_sliding_windows(req, req.seqlen - 1, eviction_interval=1)
        finally:
            allocator.free_group_end()

    # -- requests <-> cursors ----------------------------------------------------------
    def _row(self, row: Any) -> Any:
        record = self.engine.view.requests.get(row) if isinstance(row, int) else None
        if record is None:
            raise ValueError(f"row {row!r} is not allocated")
        return record

    def _record(self, req: Any) -> Any:
        return self._row(req.kv.req_pool_idx)

    def _cursor(self, req: Any) -> HybridCursor:
        self._record(req)
        lock = req.lock
        receipt = lock.planned() if lock is not None else HybridCursor(0).lock
        if receipt.node != ROOT and receipt.node not in self.engine.view.nodes:
            raise ValueError(f"{req!r}'s locked node {receipt.node} is gone")
        return HybridCursor(int(req.kv.req_pool_idx), req.kv.cache_protected_len, receipt,
                            req.kv.get_evicted_seqlen(SWA), req.swa_branching_seqlen)

    def _write_back(self, req: Any, cursor: HybridCursor, *, moved: bool) -> None:
        req.kv.set_evicted_seqlen(SWA, cursor.evicted)
        req.swa_branching_seqlen = cursor.branching_seqlen
        if not moved:
            return
        receipt = cursor.lock
        node = TreeNode(self, receipt.node)
        uuids = {SWA: receipt.uuid or None}  # 0.5.23 records None for a root window
        req.lock = HybridLock(node, HybridReceipt(receipt.node, uuids))
        req.kv.cache_protected_len = cursor.protected_len
        req.kv.cache_inserted_len = max(req.kv.cache_inserted_len, cursor.protected_len)
        req.last_node = node


def checkpoint_kv_cache(req: Any, tree_cache: Any) -> None:
    """0.5.23's ``common.checkpoint_kv_cache``: publish what a running request's last extend
    computed (``checkpoint(req, up_to=req.extend_end)``); the next extend resumes there."""
    if req.finished():
        raise ValueError(f"{req!r} has finished: release its KV cache instead")
    tree_cache.checkpoint(req, up_to=req.extend_end)
    req.prefix_len = req.extend_end


def release_kv_cache(req: Any, tree_cache: Any, *, checkpoint: bool) -> None:
    """0.5.23's ``common.release_kv_cache`` (``tree_cache.release_kv_cache``)."""
    tree_cache.release_kv_cache(req, checkpoint=checkpoint)


__all__ = ["SWA_EVICTION_INTERVAL", "UnifiedFlows", "checkpoint_kv_cache", "release_kv_cache"]
