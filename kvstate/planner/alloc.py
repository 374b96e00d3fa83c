"""Allocation planning: SGLang's slot arithmetic plus scheduler-level eviction.

``extend_slots`` and ``decode_slots`` are the pure math of SGLang's
``alloc_extend`` / ``alloc_decode`` (page size P)::

    positions  prefix_len ......................................... seq_len
               | part 1: rest of the | part 2: whole new | part 3: new  |
               | old partial page    | pages             | partial page |
               last_loc+1, +2, ...     page*P + k          page*P + k

New pages come from the head of the free list, request by request.  The bare
allocator flows never evict; ``plan_extend`` / ``plan_decode`` are the
scheduler-level flows that evict exactly the deficit first and return
``None`` (with no events) on a logical out-of-memory.  What they evict is the
policy's choice: a ``priority`` for the planner's leaf order, or a policy's
own ``victims`` (``kvstate.planner.policy``), which take precedence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.events import Allocate, Append, Evict
from kvstate.planner.builder import Builder
from kvstate.planner.evict import Priority, Victims, eviction_order, freed_pages, lru_priority
from kvstate.state import RequestId


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def new_pages_for_extend(page_size: int, prefix_len: int, seq_len: int) -> int:
    return cdiv(seq_len, page_size) - cdiv(prefix_len, page_size)


def extend_slots(
    page_size: int,
    entries: Sequence[tuple[int, int, int]],
    free_pages: Sequence[int],
) -> list[list[int]]:
    """Slots for each ``(prefix_len, seq_len, last_loc)``; consumes ``free_pages`` in order."""
    size = page_size
    out: list[list[int]] = []
    page_start = 0
    for prefix_len, seq_len, last_loc in entries:
        slots: list[int] = []
        boundary = cdiv(prefix_len, size) * size
        fill = min(seq_len, boundary) - prefix_len
        slots.extend(range(last_loc + 1, last_loc + 1 + fill))
        whole = seq_len // size * size
        taken = 0
        for offset in range(max(whole - boundary, 0)):
            slots.append(free_pages[page_start + offset // size] * size + offset % size)
        taken = max(whole - boundary, 0) // size
        tail = seq_len - whole if seq_len > boundary else 0
        if tail:
            page = free_pages[page_start + taken]
            slots.extend(page * size + k for k in range(tail))
            taken += 1
        page_start += taken
        out.append(slots)
    return out


def decode_slots(
    page_size: int, entries: Sequence[tuple[int, int]], free_pages: Sequence[int]
) -> list[int]:
    """One slot per ``(seq_len_before, last_loc)``: ``last_loc + 1`` or a fresh page's first slot."""
    out: list[int] = []
    taken = 0
    for seq_len, last_loc in entries:
        if seq_len % page_size == 0:
            out.append(free_pages[taken] * page_size)
            taken += 1
        else:
            out.append(last_loc + 1)
    return out


def _selector(priority: Priority, victims: Victims | None) -> Victims:
    """The policy's victims, or the planner's leaf order under ``priority``."""
    if victims is not None:
        return victims
    return lambda state, num_tokens: eviction_order(state, num_tokens, priority)


def _ensure_pages(b: Builder, pages_needed: int, at_head: bool, select: Victims) -> bool:
    """Evict exactly the page deficit (in tokens), as ``select`` chooses, when that covers
    it; False (and no event) when even eviction cannot."""
    state = b.state
    available = len(state.free_pages)
    if pages_needed <= available:
        return True
    size = state.geometry.page_size
    order = list(select(state, (pages_needed - available) * size))
    if not order or available + freed_pages(state, order) < pages_needed:
        return False
    b.emit(Evict(tuple(order), at_head))
    return True


def last_loc(state: Any, request_id: RequestId) -> int:
    """The slot of a request's last mapped position (-1 when it maps nothing)."""
    record = state.requests[request_id]
    if record.allocated == 0:
        return -1
    size = state.geometry.page_size
    position = record.allocated - 1
    return int(record.pages[position // size]) * size + position % size


def plan_extend(
    b: Builder,
    items: Sequence[tuple[RequestId, int]],
    *,
    at_head: bool,
    priority: Priority = lru_priority,
    commit: bool = True,
    victims: Victims | None = None,
) -> list[list[int]] | None:
    """Grow each request to ``seq_len`` from its mapped length (one batched ``Allocate``).

    Evicts only the page deficit first (``Evict``: ``victims`` if given, else
    leaves by ``priority``); returns ``None``, emitting nothing, when that
    cannot cover it.  With ``commit`` the new tokens are
    also marked written (``Append``, SGLang's extend).
    """
    state = b.state
    size = state.geometry.page_size
    items = [(r if type(r) is str else int(r), int(n)) for r, n in items]
    entries = []
    pages_needed = 0
    for request_id, seq_len in items:
        prefix_len = state.requests[request_id].allocated
        entries.append((prefix_len, seq_len, last_loc(state, request_id)))
        pages_needed += new_pages_for_extend(size, prefix_len, seq_len)
    if not _ensure_pages(b, pages_needed, at_head, _selector(priority, victims)):
        return None
    fresh = b.state.free_pages.head(pages_needed)
    slots = extend_slots(size, entries, fresh)
    b.emit(Allocate(tuple(fresh), tuple(
        (request_id, tuple(s)) for (request_id, _), s in zip(items, slots, strict=True))))
    if commit:
        b.emit(Append(tuple(items)))
    return slots


def plan_decode(
    b: Builder,
    request_ids: Sequence[RequestId],
    *,
    at_head: bool,
    priority: Priority = lru_priority,
    victims: Victims | None = None,
) -> list[int] | None:
    """One new token for each request: a batched ``Allocate`` plus ``Append`` (one decode
    step), after an ``Evict`` of the deficit (as ``plan_extend`` chooses it); ``None``
    (no event) when it cannot fit."""
    state = b.state
    size = state.geometry.page_size
    requests = state.requests
    request_ids = [r if type(r) is int or type(r) is str else int(r) for r in request_ids]
    records = [requests[r] for r in request_ids]
    pages_needed = sum(1 for record in records if record.allocated % size == 0)
    if not _ensure_pages(b, pages_needed, at_head, _selector(priority, victims)):
        return None
    fresh = iter(b.state.free_pages.head(pages_needed))
    pages: list[int] = []
    items = []
    appends = []
    for request_id, record in zip(request_ids, records, strict=True):
        length = record.allocated
        offset = length % size
        if offset:  # the next slot of its partial page
            slot = record.pages[length // size] * size + offset
        else:
            page = next(fresh)
            pages.append(page)
            slot = page * size
        items.append((request_id, (slot,)))
        appends.append((request_id, length + 1))
    b.emit(Allocate(tuple(pages), tuple(items)))
    b.emit(Append(tuple(appends)))
    return [slot for _, (slot,) in items]
