"""FULL + MAMBA (and FULL + SWA + MAMBA) request flows (SGLang 0.5.23): ``checkpoint_into_tree``
and ``release_kv_cache`` with a ``MambaComponent``.

What a checkpoint caches depends on the strategy:

* ``no_buffer`` (page 1): the whole key.  Unfinished, the running state is
  forked into a fresh slot (``MambaAlloc`` + ``MambaCopy``) that the insert
  hands to the tree; finished, the request donates its running slot.
* ``extra_buffer``: only up to the last tracked checkpoint
  (``mamba_last_track_seqlen``, held in a ping-pong track slot).  Unfinished,
  that slot goes to the tree and a fresh one takes its place in the row
  (``MambaDonate``); finished, the latest track slot is donated, or the
  other one when the latest overshoots the key, or nothing.

Either way a state that the tree has already (``mamba_exist``) is not taken:
an unfinished request frees its fork, a finished one frees every slot.  After
an unfinished checkpoint the tracked seqlens are forgotten.  With an SWA
pool the request first frees SWA that left its window, keeping a window
behind its last tracked checkpoint (SGLang's ``swa_retain_floor``).
``MambaCursor`` is what SGLang keeps on ``Req`` for these decisions: an input
and an output here, never core state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from kvstate.events import MambaCopy, MambaDonate, MambaFree, ReqFree, SwaFree
from kvstate.planner.builder import Builder
from kvstate.planner.mamba_insert import MambaInserted, MambaInsertSpec, plan_mamba_insert
from kvstate.planner.mamba_match import NO_LOCK, MambaReceipt, plan_mamba_lock, plan_mamba_unlock
from kvstate.planner.mamba_slots import plan_free_row_slots, plan_slot_or_evict
from kvstate.planner.swa_insert import free_full, pages_of
from kvstate.planner.swa_match import path_slots
from kvstate.planner.swa_requests import HybridCursor, plan_free_row, rewrite_row
from kvstate.state import RequestId


@attrs.frozen
class MambaConfig:
    extra_buffer: bool  # SGLang's mamba_radix_cache_strategy == "extra_buffer"
    track_slots: int = 2  # ping-pong track buffer size (2 with the overlap scheduler)
    window: int | None = None  # the SWA window (None: no SWA pool)
    at_head: bool = False  # FULL frees at the head (pages) or the tail (tokens)


@attrs.frozen
class MambaCursor:
    request: RequestId
    protected_len: int = 0  # [0, protected_len) belongs to the tree
    inserted_len: int = 0  # SGLang's cache_inserted_len
    lock: MambaReceipt = NO_LOCK
    swa_evicted: int = 0  # the SWA eviction cursor (0 without an SWA pool)
    last_track_seqlen: int | None = None  # extra_buffer: the latest tracked checkpoint
    prev_track_seqlen: int | None = None  # the one before it (in the other track slot)
    keep: int = 0  # the track entry (0-based) holding the latest checkpoint


@attrs.frozen
class Checkpointed:
    cursor: MambaCursor
    inserted: MambaInserted | None  # None: nothing was inserted
    slots_gone: bool  # a finished request's slots all left its row (freed or in the tree)


def swa_window_frees(state: Any, cursor: MambaCursor, pre_len: int, *, window: int,
                     interval: int = 1) -> tuple[int, list[int]]:
    """SGLang's ``free_swa_out_of_window_slots`` for a Mamba tree: the new SWA cursor and
    the pages whose SWA left the window (the threshold kept a window behind the last
    tracked checkpoint)."""
    evicted = cursor.swa_evicted
    if pre_len - window < evicted + interval:
        return evicted, []
    size = state.geometry.page_size
    evicted = max(evicted, cursor.protected_len)  # the tree-owned prefix is not the request's
    threshold = pre_len - -(-max(window, size) // size) * size
    if cursor.last_track_seqlen is not None:
        threshold = min(threshold, cursor.last_track_seqlen - window)
    new = max(evicted, threshold) // size * size
    if new <= evicted:
        return evicted, []
    return new, pages_of(state, cursor.request, evicted, new)


def _select_finished(cursor: MambaCursor, length: int, track_slots: int) -> tuple[int, int] | None:
    """SGLang's ``_select_finished_checkpoint``: (cache length, track entry) or ``None``."""
    cached = cursor.last_track_seqlen or 0
    if cached <= length:
        return cached, cursor.keep
    previous = cursor.prev_track_seqlen
    if track_slots != 2 or previous is None or previous > length:
        return None
    return previous, 1 - cursor.keep


def caches_nothing(*, finished: bool, config: MambaConfig,
                   last_track_seqlen: int | None) -> bool:
    """Whether an unfinished checkpoint has nothing to do: with the extra buffer and no
    tracked checkpoint it caches nothing, frees no SWA (its floor is at 0) and takes no
    slot, so ``plan_mamba_checkpoint`` would emit nothing and only forget the tracked
    seqlens."""
    return not finished and config.extra_buffer and last_track_seqlen is None


def plan_mamba_checkpoint(b: Builder, cursor: MambaCursor, token_ids: Sequence[int], *,
                          up_to: int, finished: bool, config: MambaConfig) -> Checkpointed:
    """Insert what the request can key up to ``up_to``, rewrite its row onto the tree's
    slots, move its lock, and settle its Mamba slots; see the module docstring."""
    tokens = tuple(token_ids[:up_to])
    row = cursor.request
    entries = b.state.mamba.rows[row]
    cache_len: int | None = cursor.last_track_seqlen if config.extra_buffer else len(tokens)
    slot, keep = 0, None
    if finished:
        if config.extra_buffer:
            picked = _select_finished(cursor, len(tokens), config.track_slots)
            if picked is not None:
                cache_len, keep = picked
                slot = entries[1 + keep]
            else:
                cache_len = 0
        else:
            cache_len, slot = cache_len or 0, entries[0]
    elif cache_len is not None:
        fresh = plan_slot_or_evict(b, at_head=config.at_head)
        if not fresh:
            raise MemoryError("no Mamba slot for the checkpoint, even after eviction")
        if config.extra_buffer:
            slot = entries[1 + cursor.keep]
            b.emit(MambaDonate(row, 1 + cursor.keep, fresh))
        else:
            b.emit(MambaCopy(entries[0], fresh))
            slot = fresh
    effective = min(len(tokens), cache_len or 0)
    if not finished and config.window is not None:
        evicted, pages = swa_window_frees(b.state, cursor, effective - 1, window=config.window)
        if pages:
            b.emit(SwaFree(tuple(pages), config.at_head))
        cursor = attrs.evolve(cursor, swa_evicted=evicted)
    inserted = None
    if effective > 0:
        size = b.state.geometry.page_size
        aligned = effective // size * size
        spec = MambaInsertSpec(config.window, cursor.protected_len, cursor.swa_evicted,
                               config.at_head)
        inserted = plan_mamba_insert(b, tokens[:effective], pages_of(b.state, row, 0, aligned),
                                     row, slot, spec)
        slots = path_slots(b.state, inserted.last_node)
        rewrite_row(b, row, cursor.protected_len, slots)
        plan_mamba_unlock(b, cursor.lock)
        receipt = plan_mamba_lock(b, inserted.last_node, window=config.window)
        cursor = attrs.evolve(cursor, protected_len=len(slots), lock=receipt,
                              inserted_len=max(cursor.inserted_len, aligned))
    taken = inserted is not None and not inserted.mamba_exist
    if finished:
        if config.extra_buffer or not taken:
            plan_free_row_slots(b, row, keep if taken else None)
        return Checkpointed(cursor, inserted, True)
    if slot and not taken:
        b.emit(MambaFree((slot,)))
    cursor = attrs.evolve(cursor, last_track_seqlen=None, prev_track_seqlen=None)
    return Checkpointed(cursor, inserted, False)


def plan_free_kv_row(b: Builder, cursor: MambaCursor, start: int, stop: int, *,
                     at_head: bool) -> None:
    """SGLang's ``free_kv_row`` of ``[start, stop)`` (FULL-only below the SWA cursor)."""
    if stop <= start:
        return
    if b.state.swa is not None:
        swa = HybridCursor(cursor.request, cursor.protected_len, evicted=cursor.swa_evicted)
        plan_free_row(b, swa, start, stop, at_head=at_head)
    else:
        free_full(b, pages_of(b.state, cursor.request, start, stop), at_head)


def plan_mamba_release(b: Builder, cursor: MambaCursor, token_ids: Sequence[int], *,
                       owned: int, checkpoint: bool, config: MambaConfig) -> MambaCursor:
    """SGLang's ``release_kv_cache``: the finishing checkpoint, free ``[protected, owned)``,
    unlock, free the over-allocated tail, give back the Mamba slots when nothing was
    checkpointed, close the row (``ReqFree``)."""
    if checkpoint:
        cursor = plan_mamba_checkpoint(b, cursor, token_ids, up_to=owned, finished=True,
                                       config=config).cursor
    plan_free_kv_row(b, cursor, cursor.protected_len, owned, at_head=config.at_head)
    plan_mamba_unlock(b, cursor.lock)
    size = b.state.geometry.page_size
    allocated = b.state.requests[cursor.request].allocated
    plan_free_kv_row(b, cursor, -(-owned // size) * size, allocated, at_head=config.at_head)
    if not checkpoint:
        plan_free_row_slots(b, cursor.request)
    b.emit(ReqFree((cursor.request,)))
    return attrs.evolve(cursor, lock=NO_LOCK)
