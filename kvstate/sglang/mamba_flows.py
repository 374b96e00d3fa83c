"""The request flows of a Mamba ``UnifiedRadixCache`` (a mixin), with 0.5.23's call forms.

* ``checkpoint(req, up_to=)`` (``checkpoint_into_tree``): the Mamba
  component prepares the state to cache (an unfinished request forks its
  running state or donates its latest track slot, taking a fresh slot, maybe
  after evicting one state; a finished one donates a slot of its own), an
  unfinished request frees the SWA that left its window (keeping one window
  behind its last tracked checkpoint), then the insert, an ``Assign``
  rewriting the row onto the tree's slots, the lock moved, and the slots the
  tree did not take given back;
* ``release_kv_cache(req, checkpoint=True)``: the finishing checkpoint,
  ``free_kv_row`` of what the request still owns, the unlock, the
  over-allocated tail, the Mamba slots when nothing was checkpointed, then
  ``ReqFree``; a request that took a copy-on-match slot but no row gives that
  slot back;
* ``evict_sliding_windows`` (with an SWA pool): the out-of-window SWA frees,
  with the same floor.

Each flow reads the request (``kvstate.sglang.mamba_req.MambaReq``) into a
``MambaCursor``, plans, and writes the new cursor back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvstate.engine import Engine
from kvstate.errors import ListenerError
from kvstate.events import MambaFree
from kvstate.planner.mamba_evict import plan_mamba_evict_for_alloc
from kvstate.planner.mamba_match import MambaReceipt
from kvstate.planner.mamba_requests import (
    MambaConfig,
    MambaCursor,
    caches_nothing,
    plan_free_kv_row,
    plan_mamba_checkpoint,
    plan_mamba_release,
    swa_window_frees,
)
from kvstate.planner.swa_decode import Evictor
from kvstate.sglang.hybrid_req import SWA
from kvstate.sglang.inputs import as_int, row_ranges
from kvstate.sglang.mamba_pool import clear_mamba_fields
from kvstate.sglang.tree_view import TreeNode
from kvstate.state import ROOT, slots_of


class MambaFlows:
    """Request flows over the shared engine; ``MambaUnifiedRadixCache`` provides the rest."""

    engine: Engine
    page_size: int
    disable: bool
    swa_window: int | None  # the SWA window (None: no SWA pool)
    enable_mamba_extra_buffer: bool
    req_to_token_pool: Any
    token_to_kv_pool_allocator: Any
    _at_head: bool
    make_lock: Callable[[MambaReceipt], Any]
    _receipt: Callable[[Any], MambaReceipt]

    def _config(self) -> MambaConfig:
        return MambaConfig(self.enable_mamba_extra_buffer,
                           self.req_to_token_pool.mamba_ping_pong_track_buffer_size,
                           self.swa_window, self._at_head)

    def checkpoint(self, req: Any, *, up_to: int) -> None:
        """Insert what the request can key of ``[cache_protected_len, up_to)`` and move its
        lock there; see the module docstring."""
        count = as_int(up_to, "up_to")
        tokens = req.full_untruncated_fill_ids
        record = self._record(req)
        if count > len(tokens) or count > record.allocated:
            raise ValueError(f"{req!r} cannot checkpoint {count} tokens")
        finished = req.finished()
        if self.disable:
            if finished:
                self._free_slots(req, None)
            return
        kv = req.kv
        config = self._config()
        if caches_nothing(finished=finished, config=config,
                          last_track_seqlen=kv.mamba_last_track_seqlen):
            if kv.req_pool_idx not in self.engine.view.mamba.rows:
                raise ValueError(f"{req!r} holds no Mamba slots")
            kv.mamba_prev_track_seqlen = None  # no batch: the plan would be empty
            return
        with self.engine.batch() as batch:
            done = plan_mamba_checkpoint(batch, self._mamba_cursor(req), tokens, up_to=count,
                                         finished=finished, config=config)
            # The request follows the events inside the batch: a listener failing at the
            # commit raises after they are applied.
            cursor = done.cursor
            if self.swa_window is not None:
                kv.set_evicted_seqlen(SWA, cursor.swa_evicted)
            kv.mamba_last_track_seqlen = cursor.last_track_seqlen
            kv.mamba_prev_track_seqlen = cursor.prev_track_seqlen
            if done.inserted is not None:
                req.lock = self.make_lock(cursor.lock)
                kv.cache_protected_len = cursor.protected_len
                kv.cache_inserted_len = cursor.inserted_len
                req.last_node = TreeNode(self, cursor.lock.node)
            self._sync_slots(req)

    def release_kv_cache(self, req: Any, *, checkpoint: bool = True) -> None:
        """Give the request's row and Mamba slots back (with ``checkpoint``: cache what it
        computed first; the request must have finished)."""
        kv = req.kv
        if kv.req_pool_idx is None:  # a copy-on-match slot taken before any row
            if kv.mamba_pool_idx is not None:
                with self.engine.batch() as batch:
                    batch.emit(MambaFree((int(kv.mamba_pool_idx),)))
                    kv.mamba_pool_idx = None  # inside the batch: see ``checkpoint``
            return
        owned = req.owned_kv_len()
        if owned > self._record(req).allocated:
            raise ValueError(f"{req!r} owns {owned} tokens past its row")
        do_checkpoint = checkpoint and not self.disable
        if do_checkpoint and not req.finished():
            raise ValueError(f"releasing unfinished {req!r} into a Mamba tree would leak its "
                             "forked state")
        with self.engine.batch() as batch:
            cursor = plan_mamba_release(batch, self._mamba_cursor(req), req.full_untruncated_fill_ids,
                                        owned=owned, checkpoint=do_checkpoint,
                                        config=self._config())
            if do_checkpoint:  # inside the batch: see ``checkpoint``
                kv.cache_protected_len = cursor.protected_len
            self._sync_slots(req)
            req.lock = None
            kv.req_pool_idx = None

    def free_kv_row(self, kv: Any, ranges: list[tuple[int, int]]) -> None:
        """Free ascending, disjoint row ranges of ``kv``'s row (FULL-only where its SWA
        was freed already)."""
        record = self._row(kv.req_pool_idx)
        cursor = MambaCursor(int(kv.req_pool_idx), kv.cache_protected_len,
                             swa_evicted=kv.get_evicted_seqlen(SWA))
        merged = row_ranges(ranges, record.allocated)
        with self.engine.batch() as batch:
            for start, end in merged:
                plan_free_kv_row(batch, cursor, start, end, at_head=self._at_head)

    def evict_sliding_windows(self, req: Any, pre_len: int, *, eviction_interval: int = 1) -> None:
        """Free the request's SWA that slid out of the window before ``pre_len``, keeping a
        window behind its last tracked checkpoint."""
        if self.swa_window is None or not req.kv.holds_kv:
            return
        cursor = self._mamba_cursor(req)
        evicted, pages = swa_window_frees(
            self.engine.view, cursor, as_int(pre_len, "pre_len"), window=self.swa_window,
            interval=as_int(eviction_interval, "eviction_interval", low=1))
        if pages:
            start = max(cursor.swa_evicted, cursor.protected_len)
            slots = slots_of(self.engine.view, cursor.request, start, evicted)
            try:
                self.token_to_kv_pool_allocator.free_swa_segment(slots, start_pos=start)
            except ListenerError:  # the free's own batch was applied: the cursor follows it
                req.kv.set_evicted_seqlen(SWA, evicted)
                raise
        if evicted != cursor.swa_evicted:
            req.kv.set_evicted_seqlen(SWA, evicted)

    def _window_slide(self, req: Any, pre_len: int, interval: int) -> tuple[int, list[int]]:
        """The request's new SWA cursor and the pages whose SWA left the window (keeping a
        window behind its last tracked checkpoint)."""
        assert self.swa_window is not None
        return swa_window_frees(self.engine.view, self._mamba_cursor(req), pre_len,
                                window=self.swa_window, interval=interval)

    def _decode_evictor(self) -> Evictor:
        at_head = self._at_head

        def evict(batch: Any, full: int, swa: int) -> None:
            plan_mamba_evict_for_alloc(batch, full, swa, 0, at_head=at_head)
        return evict

    # -- requests <-> cursors ----------------------------------------------------------
    def _row(self, row: Any) -> Any:
        record = self.engine.view.requests.get(row) if isinstance(row, int) else None
        if record is None:
            raise ValueError(f"row {row!r} is not allocated")
        return record

    def _record(self, req: Any) -> Any:
        return self._row(req.kv.req_pool_idx)

    def _mamba_cursor(self, req: Any) -> MambaCursor:
        self._record(req)
        kv = req.kv
        if kv.req_pool_idx not in self.engine.view.mamba.rows:
            raise ValueError(f"{req!r} holds no Mamba slots")
        receipt = self._receipt(req.lock) if req.lock is not None else MambaReceipt(ROOT)
        if receipt.node != ROOT and receipt.node not in self.engine.view.nodes:
            raise ValueError(f"{req!r}'s locked node {receipt.node} is gone")
        keep = kv.mamba_last_track_idx or 0
        return MambaCursor(int(kv.req_pool_idx), kv.cache_protected_len, kv.cache_inserted_len,
                           receipt, kv.get_evicted_seqlen(SWA), kv.mamba_last_track_seqlen,
                           kv.mamba_prev_track_seqlen, keep)

    def _sync_slots(self, req: Any) -> None:
        """Write the row's Mamba slots back to the request, or clear them once freed (a slot
        the tree took keeps its stale id, as 0.5.23's request does)."""
        kv = req.kv
        entries = self.engine.view.mamba.rows.get(kv.req_pool_idx)
        if entries is None:
            if kv.mamba_pool_idx is not None and kv.mamba_pool_idx not in \
                    self.engine.view.mamba.slot_node:
                clear_mamba_fields(kv)
            return
        if entries[0]:
            kv.mamba_pool_idx = entries[0]
        if kv.mamba_ping_pong_track_buffer is not None:
            kv.mamba_ping_pong_track_buffer = [slot or old for slot, old in
                                               zip(entries[1:], kv.mamba_ping_pong_track_buffer,
                                                   strict=True)]

    def _free_slots(self, req: Any, keep: int | None) -> None:
        if req.kv.mamba_pool_idx is not None:
            self.req_to_token_pool.free_mamba_cache(req, keep)


__all__ = ["MambaFlows"]
