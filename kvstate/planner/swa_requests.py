"""FULL + SWA hybrid request flows (SGLang 0.5.23): paired allocation, out-of-window SWA
frees, ``checkpoint_into_tree`` and ``release_kv_cache``.

A request's row (W = window, P = page)::

    0 ...... evicted ...... protected ...... pre_len - ceil(max(W, P) / P) * P ...... owned
    | tree (its SWA maybe   | own FULL only  | own FULL + SWA (the live window) .........|
    |  tombstoned)          | (SWA freed)    |

``HybridCursor`` is what SGLang keeps on ``Req`` (``cache_protected_len``,
the lock receipt, the SWA eviction cursor ``component_evicted_seqlens[SWA]``,
``swa_branching_seqlen``): an input and an output here, never core state.
The out-of-window free runs at every unfinished checkpoint (interval 1) and
in decode when SGLang's scheduler finds the request due (every
``SGLANG_SWA_EVICTION_INTERVAL`` = 128 tokens by default); it frees only the
request's own positions, never the tree's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from kvstate.events import Assign, ReqFree, SwaAlloc, SwaFree
from kvstate.planner.builder import Builder
from kvstate.planner.swa_insert import (
    InsertSpec,
    UnifiedInsert,
    free_both,
    free_full,
    pages_of,
    plan_unified_insert,
)
from kvstate.planner.swa_match import (
    Receipt,
    path_slots,
    plan_unified_lock,
    plan_unified_unlock,
)
from kvstate.state import ROOT, RequestId

NO_LOCK = Receipt(ROOT, 0, False)


@attrs.frozen
class HybridCursor:
    request: RequestId
    protected_len: int = 0  # [0, protected_len) belongs to the tree
    lock: Receipt = NO_LOCK  # the request's tree lock
    evicted: int = 0  # [0, evicted): the request has freed (or never owned) this SWA
    branching_seqlen: int | None = None  # from the admission match (None: no branch)


def plan_paired_pages(b: Builder, full_pages: Sequence[int]) -> list[int]:
    """Pair freshly allocated FULL pages with SWA pages from the head (``SwaAlloc``)."""
    swa_pages = b.state.swa.free_pages.head(len(full_pages))
    if full_pages:
        b.emit(SwaAlloc(tuple(zip(full_pages, swa_pages, strict=True))))
    return swa_pages


def out_of_window(state: Any, cursor: HybridCursor, pre_len: int, *, window: int,
                  interval: int = 1) -> tuple[HybridCursor, list[int]]:
    """The request's pages whose SWA left the window (positions ``[evicted, new)``) and
    the advanced cursor; nothing when fewer than ``interval`` tokens slid out."""
    evicted = cursor.evicted
    if pre_len - window < evicted + interval:
        return cursor, []
    size = state.geometry.page_size
    evicted = max(evicted, cursor.protected_len)  # the tree-owned prefix is not the request's
    keep = -(-max(window, size) // size) * size
    new = max(evicted, pre_len - keep) // size * size
    if new <= evicted:
        return attrs.evolve(cursor, evicted=evicted), []
    pages = pages_of(state, cursor.request, evicted, new)
    return attrs.evolve(cursor, evicted=new), pages


def plan_hybrid_checkpoint(b: Builder, cursor: HybridCursor, token_ids: Sequence[int], *,
                           up_to: int, finished: bool, fill_len: int, window: int,
                           at_head: bool) -> tuple[HybridCursor, UnifiedInsert | None]:
    """SGLang's ``checkpoint_into_tree``: insert ``token_ids[:up_to]`` (only up to the
    branching seqlen when the admission match left one), rewrite the row onto the tree's
    slots, move the lock; unfinished requests first free their out-of-window SWA."""
    tokens = tuple(token_ids[:up_to])
    length, branch = len(tokens), None
    branching = cursor.branching_seqlen
    if branching is not None and cursor.protected_len < branching <= length:
        length, branch = branching, branching
    if not finished:
        cursor, pages = out_of_window(b.state, cursor, length - 1, window=window)
        if pages:
            b.emit(SwaFree(tuple(pages), at_head))
    if length <= 0:
        return cursor, None
    size = b.state.geometry.page_size
    aligned = length // size * size
    request = cursor.request
    row = pages_of(b.state, request, 0, aligned)
    spec = InsertSpec(window, cursor.protected_len, cursor.evicted, branch, at_head)
    result = plan_unified_insert(b, tokens[:length], row, request, spec)
    slots = path_slots(b.state, result.last_node)
    rewrite_row(b, request, cursor.protected_len, slots)
    plan_unified_unlock(b, cursor.lock)
    receipt = plan_unified_lock(b, result.last_node, window=window)
    cursor = attrs.evolve(cursor, protected_len=len(slots), lock=receipt)
    if result.branch_inserted:
        cursor = attrs.evolve(cursor, branching_seqlen=None)
        if not finished:
            cursor, pages = out_of_window(b.state, cursor, fill_len - 1, window=window)
            if pages:
                b.emit(SwaFree(tuple(pages), at_head))
    return cursor, result


def rewrite_row(b: Builder, request: RequestId, start: int, slots: tuple[int, ...]) -> None:
    """Point ``row[start:len(slots)]`` at the tree's slots after a checkpoint's insert (the
    SWA and the Mamba checkpoints): ``Assign``, or nothing when the row already maps them and
    none of them was freed under it."""
    if len(slots) <= start:
        return
    record = b.state.requests[request]
    size = b.state.geometry.page_size
    first, last = start // size, (len(slots) - 1) // size
    current = tuple(record.pages[first:last + 1])
    wanted = tuple(slots[index * size] // size for index in range(first, last + 1))
    dangling = any(first <= index <= last for index in record.dangling)
    if current != wanted or dangling:
        b.emit(Assign(request, start, slots[start:]))


def plan_free_row(b: Builder, cursor: HybridCursor, start: int, stop: int, *,
                  at_head: bool) -> None:
    """SGLang's ``free_kv_row`` of ``[start, stop)``: the part whose SWA the request freed
    already (``[protected, evicted)``) goes back FULL-only, the rest with its SWA."""
    if stop <= start:
        return
    dead_hi = max(cursor.evicted, cursor.protected_len)
    low = min(max(cursor.protected_len, start), stop)
    high = min(max(dead_hi, start), stop)
    request = cursor.request
    if high <= low:
        free_both(b, pages_of(b.state, request, start, stop), at_head)
        return
    free_full(b, pages_of(b.state, request, low, high), at_head)  # SGLang frees these first
    for lo, hi in ((start, low), (high, stop)):
        free_both(b, pages_of(b.state, request, lo, hi), at_head)


def plan_hybrid_release(b: Builder, cursor: HybridCursor, token_ids: Sequence[int], *,
                        owned: int, checkpoint: bool, window: int, at_head: bool) -> HybridCursor:
    """SGLang's ``release_kv_cache``: checkpoint (finished), free ``[protected, owned)``,
    unlock, free the over-allocated tail, close the row (``ReqFree``)."""
    if checkpoint:
        cursor, _ = plan_hybrid_checkpoint(b, cursor, token_ids, up_to=owned, finished=True,
                                           fill_len=len(token_ids), window=window,
                                           at_head=at_head)
    plan_free_row(b, cursor, cursor.protected_len, owned, at_head=at_head)
    plan_unified_unlock(b, cursor.lock)
    size = b.state.geometry.page_size
    allocated = b.state.requests[cursor.request].allocated
    start = -(-owned // size) * size
    plan_free_row(b, cursor, start, allocated, at_head=at_head)
    b.emit(ReqFree((cursor.request,)))
    return attrs.evolve(cursor, lock=NO_LOCK)
