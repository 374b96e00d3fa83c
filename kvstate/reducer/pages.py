"""Reducer rules for pages and request tables: allocate, append, assign, truncate, free.

Token range ownership inside one request's table (P = page size)::

    positions  0 ........ k*P ........ allocated ....... row_width
               | tree pages | own pages | (unmapped)
                 referenced   held by the request; the last one may be partial

Only ``Allocate`` takes pages off the free list and only ``Free`` puts
DETACHED pages back, so every move of a page is visible in the event stream.
"""

from __future__ import annotations

from pyrsistent import pvector

from kvstate.events import Allocate, Append, Assign, Copy, Free, Share, Truncate
from kvstate.reducer import Reject, handles
from kvstate.reducer.common import check_distinct, check_page_id, check_request, release_holds
from kvstate.state import DETACHED, Request, State


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
    with holders.mutate() as out_holders, requests.mutate() as out_requests:
        for request_id, slots in event.items:
            record = out_requests.get(request_id)
            if record is None:
                raise Reject(f"unknown request {request_id!r}")
            position = record.allocated
            if position + len(slots) > width:
                raise Reject(f"request {request_id!r} would map {position + len(slots)} tokens,"
                             f" past the row width {width}")
            table = record.pages
            appended: list[int] = []
            for slot in slots:
                page, offset = divmod(slot, size)
                if offset != position % size:
                    raise Reject(f"slot {slot} at position {position} breaks slot % P == pos % P")
                if offset == 0:
                    if page not in fresh or page in used:
                        raise Reject(f"slot {slot} needs page {page} to be newly allocated "
                                     "in this event")
                    used.add(page)
                    appended.append(page)
                    out_holders[page] = (request_id,)
                else:
                    index = position // size
                    current = appended[-1] if index >= len(table) else table[index]
                    if page != current:
                        raise Reject(f"slot {slot} at position {position} is not in the "
                                     f"request's partial page {current}")
                    if not appended and request_id not in state.holders.get(page, ()):
                        raise Reject(f"request {request_id!r} does not hold its partial page {page}")
                position += 1
            if appended:
                table = table.extend(appended)
            out_requests[request_id] = Request(table, position, record.committed)
        if used != fresh:
            raise Reject(f"pages {sorted(fresh - used)} were allocated but mapped by no item")
        holders = out_holders.finish()
        requests = out_requests.finish()
    return state.with_changes(free_pages=free_pages.take(pages), holders=holders,
                              requests=requests)


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
    allocated = max(record.allocated, stop)
    old_pages = list(record.pages)
    new_pages = old_pages[:]
    written: dict[int, int] = {}  # page index -> page, for this write
    for position, slot in zip(range(start, stop), slots, strict=True):
        page, offset = divmod(slot, size)
        if offset != position % size:
            raise Reject(f"slot {slot} at position {position} breaks slot % P == pos % P")
        check_page_id(state, page)
        index = position // size
        if written.setdefault(index, page) != page:
            raise Reject(f"slot {slot} puts page index {index} on two pages "
                         f"({written[index]} and {page})")
        if index < len(new_pages):
            page_start = index * size
            covers_page = start <= page_start and min(page_start + size, allocated) <= stop
            if new_pages[index] != page and not covers_page:
                raise Reject(f"slot {slot} splits page index {index} between pages "
                             f"{new_pages[index]} and {page}")
            new_pages[index] = page
        else:
            new_pages.append(page)
    holders = state.holders
    kept = set(new_pages)
    before = set(old_pages)
    added = [p for p in dict.fromkeys(new_pages) if p not in before]
    with holders.mutate() as out:
        for page in added:
            held = out.get(page, ())
            if page in state.page_node or request_id in held:
                continue
            if held == (DETACHED,):
                out[page] = (request_id,)
            else:
                raise Reject(f"page {page} is not allocated to request {request_id!r}"
                             f" (holders {list(held)})")
        holders = out.finish()
    dropped = [p for p in old_pages if p not in kept]
    holders = release_holds(holders, state.page_node, request_id, dropped)
    new_record = Request(pvector(new_pages), allocated, min(record.committed, allocated))
    return state.with_changes(holders=holders,
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
    holders = release_holds(state.holders, state.page_node, event.request, dropped)
    new_record = Request(kept_pages, event.length, min(record.committed, event.length))
    return state.with_changes(holders=holders,
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
