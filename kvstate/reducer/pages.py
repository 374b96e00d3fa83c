"""Reducer rules for pages and request tables: allocate, append, assign, truncate, free.

Token range ownership inside one request's table (P = page size)::

    positions  0 ........ k*P ........ allocated ....... row_width
               | tree pages | own pages | (unmapped)
                 referenced   held by the request; the last one may be partial

Only ``Allocate`` takes pages off the free list and only ``Free`` puts
DETACHED pages back, so every move of a page is visible in the event stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from immutables import Map

from kvstate.events import Allocate, Append, Assign, Copy, Free, Share, Truncate
from kvstate.reducer import Reject, handles
from kvstate.reducer.common import (
    adjust_tree_refs,
    check_distinct,
    check_page_id,
    check_request,
    release_holds,
    unheld_tree_pages,
)
from kvstate.state import DETACHED, Request, RequestId, State, expand_pages


@handles(Allocate)
def allocate(state: State, event: Allocate) -> State:
    pages = event.pages
    check_distinct(pages, "page")
    free_pages = state.free_pages
    for page in pages:
        if page not in free_pages:
            check_page_id(state, page)
            raise Reject(f"page {page} is not free (allocating a taken page)")
    holders = state.holders
    if not event.items:
        with holders.mutate() as out:
            for page in pages:
                out[page] = (DETACHED,)
            holders = out.finish()
        return state.with_changes(free_pages=free_pages.take(pages), holders=holders)

    size = state.geometry.page_size
    width = state.geometry.row_width
    fresh = set(pages)
    used: set[int] = set()
    requests = state.requests
    holders_get, page_node = state.holders.get, state.page_node
    with holders.mutate() as out_holders, requests.mutate() as out_requests:
        for request_id, slots in event.items:
            record = out_requests.get(request_id)
            if record is None:
                raise Reject(f"unknown request {request_id!r}")
            if not slots:
                continue
            position = record.allocated
            if position + len(slots) > width:
                raise Reject(f"request {request_id!r} would map {position + len(slots)} tokens,"
                             f" past the row width {width}")
            offset = position % size
            if offset and len(slots) == 1:
                # Decode fast path: one token continuing the request's own partial page.
                partial = _own_partial_page(holders_get, page_node, request_id, record)
                if slots[0] != partial * size + offset:
                    _explain_slots(slots, (partial * size + offset,), position, size)
                out_requests[request_id] = Request(record.pages, position + 1, record.committed)
                continue
            head = (size - offset) % size  # slots that continue the current partial page
            new_pages = [slot // size for slot in slots[head::size]]
            if head:
                partial = _own_partial_page(holders_get, page_node, request_id, record)
                first_slot = partial * size + offset
                continues = slots[:head]
                if continues[0] != first_slot or (
                        head > 1 and continues != tuple(range(first_slot, first_slot + len(continues)))):
                    _explain_slots(slots, expand_pages([partial, *new_pages], size)[offset:], position, size)
            if new_pages and expand_pages(new_pages, size)[: len(slots) - head] != slots[head:]:
                _explain_slots(slots, (slots[:head] + expand_pages(new_pages, size)), position, size)
            for page in new_pages:
                if page not in fresh or page in used:
                    raise Reject(f"page {page} must be newly allocated in this event "
                                 "(once) to start a page")
                used.add(page)
                out_holders[page] = (request_id,)
            table = record.pages.extend(new_pages) if new_pages else record.pages
            out_requests[request_id] = Request(table, position + len(slots), record.committed)
        if used != fresh:
            raise Reject(f"pages {sorted(fresh - used)} were allocated but mapped by no item")
        holders = out_holders.finish()
        requests = out_requests.finish()
    return state.with_changes(free_pages=free_pages.take(pages), holders=holders,
                              requests=requests)


def _own_partial_page(holders_get: Callable[[int], Any], page_node: Map[int, int],
                      request_id: RequestId, record: Request) -> int:
    """The request's partial last page; it must hold it alone, outside the tree."""
    partial = record.pages[-1]
    if holders_get(partial) != (request_id,) or partial in page_node:
        raise Reject(f"request {request_id!r} must hold its partial page {partial} "
                     "alone to append into it (shared pages need copy-on-write)")
    return int(partial)


def _explain_slots(slots: tuple[int, ...], expected: tuple[int, ...], position: int, size: int) -> None:
    """Raise a precise rejection for the first slot that breaks the page geometry."""
    for index, (slot, want) in enumerate(zip(slots, expected, strict=False)):
        if slot != want:
            at = position + index
            if slot % size != at % size:
                raise Reject(f"slot {slot} at position {at} breaks slot % P == pos % P")
            raise Reject(f"slot {slot} at position {at} is not in the page that position "
                         f"maps to (expected slot {want})")
    raise Reject("slots do not cover the positions they are written to")


@handles(Append)
def append(state: State, event: Append) -> State:
    check_distinct([request_id for request_id, _ in event.items], "request")
    with state.requests.mutate() as out:
        for request_id, committed in event.items:
            record = out.get(request_id)
            if record is None:
                raise Reject(f"unknown request {request_id!r}")
            if committed > record.allocated:
                raise Reject(f"append to {committed} tokens is beyond the {record.allocated} "
                             f"allocated slots of request {request_id!r}")
            if committed < record.committed:
                raise Reject(f"append cannot lower committed tokens of {request_id!r} "
                             f"from {record.committed} to {committed}")
            out[request_id] = Request(record.pages, record.allocated, committed)
        requests = out.finish()
    return state.with_changes(requests=requests)


@handles(Assign)
def assign(state: State, event: Assign) -> State:
    request_id, start, slots = event.request, event.start, event.slots
    check_request(state, request_id)
    record = state.requests[request_id]
    size = state.geometry.page_size
    if start < 0 or start > record.allocated:
        raise Reject(f"write at {start} leaves a gap after {record.allocated} mapped tokens")
    stop = start + len(slots)
    if stop > state.geometry.row_width:
        raise Reject(f"write to position {stop} is past the row width {state.geometry.row_width}")
    if not slots:
        return state
    allocated = max(record.allocated, stop)
    first, last = start // size, (stop - 1) // size
    written = [slots[max(index * size, start) - start] // size for index in range(first, last + 1)]
    expected = expand_pages(written, size)[start - first * size: stop - first * size]
    if expected != slots:
        _explain_slots(slots, expected, start, size)
    check_distinct(written, "page")
    old_pages = record.pages
    for index in {first, last}:  # a partly written page must stay the same page
        if index < len(old_pages):
            page_start = index * size
            covers_page = start <= page_start and min(page_start + size, allocated) <= stop
            if old_pages[index] != written[index - first] and not covers_page:
                raise Reject(f"write splits page index {index} between pages "
                             f"{old_pages[index]} and {written[index - first]}")
    replaced = list(old_pages[first: last + 1])
    outside = set(old_pages[:first]) | set(old_pages[last + 1:])
    clash = outside.intersection(written)
    if clash:
        raise Reject(f"page {min(clash)} would appear twice in request {request_id!r}'s table")
    holders = state.holders
    before = set(replaced)
    kept = set(written)
    referenced = unheld_tree_pages(state, request_id, [p for p in written if p not in before])
    unreferenced = unheld_tree_pages(state, request_id, [p for p in replaced if p not in kept])
    tree_refs = adjust_tree_refs(state.tree_refs, referenced, +1)
    tree_refs = adjust_tree_refs(tree_refs, unreferenced, -1)
    with holders.mutate() as out:
        for page in written:
            if page in before or page in state.page_node:
                continue
            held = out.get(page, ())
            if request_id in held:
                continue
            if held == (DETACHED,):
                out[page] = (request_id,)
            else:
                check_page_id(state, page)
                raise Reject(f"page {page} is not allocated to request {request_id!r}"
                             f" (holders {list(held)})")
        holders = out.finish()
    holders = release_holds(holders, state.page_node, request_id,
                            [p for p in replaced if p not in kept])
    table = old_pages[:first].extend(written).extend(old_pages[last + 1:])
    new_record = Request(table, allocated, min(record.committed, allocated))
    return state.with_changes(holders=holders, tree_refs=tree_refs,
                              requests=state.requests.set(request_id, new_record))


@handles(Truncate)
def truncate(state: State, event: Truncate) -> State:
    check_request(state, event.request)
    record = state.requests[event.request]
    if not 0 <= event.length <= record.allocated:
        raise Reject(f"truncate to {event.length} outside 0..{record.allocated}")
    keep = -(-event.length // state.geometry.page_size)
    kept_pages = record.pages[:keep]
    kept = set(kept_pages)
    dropped = [p for p in record.pages[keep:] if p not in kept]
    tree_refs = adjust_tree_refs(state.tree_refs, unheld_tree_pages(state, event.request, dropped), -1)
    holders = release_holds(state.holders, state.page_node, event.request, dropped)
    new_record = Request(kept_pages, event.length, min(record.committed, event.length))
    return state.with_changes(holders=holders, tree_refs=tree_refs,
                              requests=state.requests.set(event.request, new_record))


@handles(Free)
def free(state: State, event: Free) -> State:
    pages = event.pages
    check_distinct(pages, "page")  # a duplicate inside one free is a double free
    holders = state.holders
    for page in pages:
        held = holders.get(page)
        if held is None:
            check_page_id(state, page)
            if page in state.page_node:
                raise Reject(f"page {page} is held by tree node {state.page_node[page]}")
            raise Reject(f"page {page} is already free (double free)")
        if page in state.page_node:
            raise Reject(f"page {page} is held by tree node {state.page_node[page]}")
        if held != (DETACHED,):
            raise Reject(f"page {page} is still held by request(s) {list(held)}; "
                         "release it from the request first")
    with holders.mutate() as out:
        for page in pages:
            del out[page]
        holders = out.finish()
    queue = state.free_pages
    queue = queue.push_head(pages) if event.at_head else queue.push_tail(pages)
    return state.with_changes(holders=holders, free_pages=queue)


@handles(Share)
def share(state: State, event: Share) -> State:
    request_id, start, slots = event.request, event.start, event.slots
    check_request(state, request_id)
    record = state.requests[request_id]
    size = state.geometry.page_size
    if start != record.allocated or start % size:
        raise Reject(f"share must start at the request's page-aligned end {record.allocated}, "
                     f"got {start}")
    if start + len(slots) > state.geometry.row_width:
        raise Reject(f"share past the row width {state.geometry.row_width}")
    pages: list[int] = []
    for position, slot in zip(range(start, start + len(slots)), slots, strict=True):
        page, offset = divmod(slot, size)
        if offset != position % size:
            raise Reject(f"slot {slot} at position {position} breaks slot % P == pos % P")
        if offset == 0:
            pages.append(page)
        elif not pages or pages[-1] != page:
            raise Reject(f"slot {slot} is not in the page being shared")
    check_distinct(pages, "page")
    already = set(record.pages).intersection(pages)
    if already:
        raise Reject(f"page {min(already)} is already in request {request_id!r}'s table")
    holders = state.holders
    with holders.mutate() as out:
        for page in pages:
            held = out.get(page, ())
            if page not in state.page_node and not held:
                check_page_id(state, page)
                raise Reject(f"page {page} is free; share only pages someone holds")
            if held == (DETACHED,):
                raise Reject(f"page {page} is DETACHED; write it with Assign instead")
            if request_id in held:
                raise Reject(f"request {request_id!r} already holds page {page}")
            out[page] = (*held, request_id)
        holders = out.finish()
    new_record = Request(record.pages.extend(pages), start + len(slots), record.committed)
    return state.with_changes(holders=holders,
                              requests=state.requests.set(request_id, new_record))


@handles(Copy)
def copy(state: State, event: Copy) -> State:
    if len(event.src_pages) != len(event.dst_pages):
        raise Reject("copy needs one destination page per source page")
    check_distinct(event.dst_pages, "destination page")
    for page in event.src_pages:
        check_page_id(state, page)
        if page not in state.page_node and page not in state.holders:
            raise Reject(f"copy source page {page} is free")
    for page in event.dst_pages:
        check_page_id(state, page)
        if state.holders.get(page) != (DETACHED,):
            raise Reject(f"copy destination page {page} must be freshly allocated (DETACHED)")
    if set(event.src_pages) & set(event.dst_pages):
        raise Reject("copy source and destination overlap")
    return state
