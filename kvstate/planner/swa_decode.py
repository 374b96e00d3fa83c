"""A hybrid decode step's KV as one decision (SGLang 0.5.23's scheduler order).

One decode step of a hybrid tree (FULL + SWA, FULL + MAMBA, FULL + SWA +
MAMBA) does, in 0.5.23's order:

1. the out-of-window SWA frees of ``maybe_evict_swa`` (one free group: one
   ``SwaFree`` of every due request's pages, in request order);
2. request by request: evict the pools' shortfall for one page's worth of
   tokens (``evict_from_tree_cache``), take the request's next slot (a fresh
   page, paired with a fresh SWA page, when the position starts a page; its
   own partial page otherwise) and write it into the row.

The allocation and the row write are one event: ``Allocate(pages, items)``
appends the slot to the row (followed by ``SwaAlloc`` pairing a fresh page),
where a front end calling ``alloc`` then ``write`` commits ``Allocate``,
``SwaAlloc`` and ``Assign``; the state after the step is the same.  A
request that finds no room (or, with SWA, continues a page without an SWA
page) stops the step there: what came before it stays planned, as in
0.5.23, and the result says why the step stopped.

A prefill chunk (``plan_extend_step``) is one decision the same way: each
pool's shortfall evicted (``extend + headroom`` tokens: a page more with
pages, as 0.5.23's scheduler asks), then, when every pool has the chunk's
new pages, the hit's slots written at admission (``Assign``) and one
``Allocate(pages, ((row, slots),))`` appending the chunk to the row (then
``SwaAlloc``), where the separate calls commit the eviction, ``Allocate``
(``SwaAlloc``) and the row writes as three or four batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from kvstate.events import Allocate, Assign, SwaAlloc, SwaFree
from kvstate.planner.builder import Builder
from kvstate.state import RequestId, expand_pages

# evict(b, FULL shortfall in tokens, SWA shortfall in tokens): the tree's evict_for_alloc
Evictor = Callable[[Builder, int, int], Any]

OUT_OF_MEMORY = "out of memory"
NO_SWA_PAGE = "no SWA page"


@attrs.frozen
class DecodeStep:
    slots: tuple[int, ...]  # the new slot of each request served, in request order
    stopped: str | None = None  # why the next request got no slot (None: every one did)


def plan_decode_step(b: Builder, window_frees: Sequence[int],
                     rows: Sequence[tuple[RequestId, int]], *, evict: Evictor | None,
                     at_head: bool) -> DecodeStep:
    """Free ``window_frees`` (FULL pages whose SWA left the window), then give each
    ``(row, length)`` the slot of position ``length``, evicting each pool's shortfall
    first (``evict``; ``None``: the tree does not evict)."""
    if window_frees:
        b.emit(SwaFree(tuple(window_frees), at_head))
    whole = _whole_step(b, rows)
    if whole is not None:
        return whole
    state = b.state
    size = state.geometry.page_size
    paired = state.swa is not None
    slots: list[int] = []
    for row, length in rows:
        if evict is not None:
            full = size - len(state.free_pages) * size
            swa = size - len(state.swa.free_pages) * size if paired else 0
            if full > 0 or swa > 0:
                evict(b, max(full, 0), max(swa, 0))
                state = b.state
        offset = length % size
        if offset:  # the row's own partial page
            page = state.requests[row].pages[length // size]
            if paired and page not in state.swa.peer:
                return DecodeStep(tuple(slots), NO_SWA_PAGE)
            slot = page * size + offset
            b.emit(Allocate((), ((row, (slot,)),)))
        else:
            free = state.free_pages
            if not free or (paired and not state.swa.free_pages):
                return DecodeStep(tuple(slots), OUT_OF_MEMORY)
            page = free.head(1)[0]
            slot = page * size
            b.emit(Allocate((page,), ((row, (slot,)),)))
            if paired:
                b.emit(SwaAlloc(((page, b.state.swa.free_pages.head(1)[0]),)))
        state = b.state
        slots.append(slot)
    return DecodeStep(tuple(slots))


def _whole_step(b: Builder, rows: Sequence[tuple[RequestId, int]]) -> DecodeStep | None:
    """The usual step, where every request finds a free page in each pool at its turn (no
    eviction, no stop): the same pages in the same order, as one ``Allocate`` (and one
    ``SwaAlloc``); ``None`` (nothing emitted) otherwise."""
    if not rows:
        return DecodeStep(())
    state = b.state
    size = state.geometry.page_size
    swa = state.swa
    requests = state.requests
    slots: list[int] = []
    fresh: list[int] = []  # the index in ``slots`` of each request that starts a page
    for index, (row, length) in enumerate(rows):
        offset = length % size
        if offset:
            page = requests[row].pages[length // size]
            if swa is not None and page not in swa.peer:
                return None
            slots.append(page * size + offset)
        else:
            fresh.append(index)
            slots.append(0)
    # the last request's turn sees the fewest free pages: all earlier fresh pages are taken
    before_last = len(fresh) - (1 if fresh and fresh[-1] == len(rows) - 1 else 0)
    if len(state.free_pages) <= before_last or (swa is not None
                                                 and len(swa.free_pages) <= before_last):
        return None
    pages = state.free_pages.head(len(fresh))
    for index, page in zip(fresh, pages, strict=True):
        slots[index] = page * size
    items = tuple((row, (slot,)) for (row, _), slot in zip(rows, slots, strict=True))
    b.emit(Allocate(tuple(pages), items))
    if swa is not None and pages:
        b.emit(SwaAlloc(tuple(zip(pages, swa.free_pages.head(len(pages)), strict=True))))
    return DecodeStep(tuple(slots))


def plan_extend_step(b: Builder, row: RequestId, end: int, *, prefix: Sequence[int] = (),
                     evict: Evictor | None, headroom: int) -> DecodeStep:
    """Map the row's positions ``[start, end)`` to fresh slots, ``start`` being its length
    (at admission ``len(prefix)``: ``prefix``, the hit's slots, is written first).  Evicts
    each pool's shortfall for ``end - start + headroom`` tokens first (``evict``; ``None``:
    the tree does not evict); stops with nothing allocated when a pool still lacks the new
    pages, or, with SWA, when the chunk continues a page that has no SWA page."""
    state = b.state
    size = state.geometry.page_size
    swa = state.swa
    start = len(prefix) if prefix else state.requests[row].allocated
    extend = end - start
    if evict is not None:
        need = extend + headroom
        full = need - len(state.free_pages) * size
        short = need - len(swa.free_pages) * size if swa is not None else 0
        if full > 0 or short > 0:
            evict(b, max(full, 0), max(short, 0))
            state, swa = b.state, b.state.swa
    count = -(-end // size) - -(-start // size)
    if count > len(state.free_pages) or (swa is not None and count > len(swa.free_pages)):
        return DecodeStep((), OUT_OF_MEMORY)
    offset = start % size
    if offset and extend and swa is not None and \
            state.requests[row].pages[start // size] not in swa.peer:
        return DecodeStep((), NO_SWA_PAGE)
    if prefix:
        b.emit(Assign(row, 0, tuple(prefix)))
    if not extend:
        return DecodeStep(())
    state = b.state
    pages = state.free_pages.head(count)
    slots = tuple(pages) if size == 1 else _chunk_slots(state, row, start, end, pages)
    appends = not offset or _owns_partial_page(state, row, start)
    # a partial page the row does not hold alone: the separate calls' Allocate and Assign
    if appends:
        b.emit(Allocate(tuple(pages), ((row, slots),)))
    elif pages:
        b.emit(Allocate(tuple(pages)))
    if swa is not None and pages:
        b.emit(SwaAlloc(tuple(zip(pages, swa.free_pages.head(len(pages)), strict=True))))
    if not appends:
        b.emit(Assign(row, start, slots))
    return DecodeStep(slots)


def _chunk_slots(state: Any, row: RequestId, start: int, end: int,
                 pages: Sequence[int]) -> tuple[int, ...]:
    """The slots of positions ``[start, end)``: the rest of the row's partial page, then
    the fresh ``pages``."""
    size = state.geometry.page_size
    offset = start % size
    slots: list[int] = []
    if offset:
        first = state.requests[row].pages[start // size] * size + offset
        slots.extend(range(first, first + min(end - start, size - offset)))
    slots.extend(expand_pages(pages, size)[: end - start - len(slots)])
    return tuple(slots)


def _owns_partial_page(state: Any, row: RequestId, start: int) -> bool:
    """Whether the row holds its page at ``start`` alone, outside the tree (``Allocate`` may
    append into it)."""
    index = start // state.geometry.page_size
    record = state.requests[row]
    page = record.pages[index] if index < len(record.pages) else 0
    return bool(state.holders.get(page) == (row,) and page not in state.page_node
                and index not in record.dangling)


__all__ = ["NO_SWA_PAGE", "OUT_OF_MEMORY", "DecodeStep", "Evictor", "plan_decode_step",
           "plan_extend_step"]
