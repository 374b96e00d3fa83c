"""Rules that return pages or share them: free, free under a row, share, copy."""

from __future__ import annotations

from typing import Any

from kvstate.events import Copy, Free, FreeMapped, Share
from kvstate.records import RequestId
from kvstate.rules.common import check_distinct, check_page_id, check_request, live_entries
from kvstate.rules.registry import Reject, rule
from kvstate.state import DETACHED


def _check_freeable(s: Any, page: int) -> tuple[Any, ...]:
    """The holders of a page that may leave (not free, not in the tree); ``Reject`` otherwise."""
    held = s.holders.get(page)
    if page in s.page_node:
        if held is None:
            check_page_id(s, page)
        raise Reject(f"page {page} is held by tree node {s.page_node[page]}")
    if held is None:
        check_page_id(s, page)
        raise Reject(f"page {page} is already free (double free)")
    if s.swa is not None and page in s.swa.peer:
        raise Reject(f"page {page} still has SWA page {s.swa.peer[page]}; free it first (SwaFree)")
    return tuple(held)


def _release(s: Any, pages: tuple[int, ...], at_head: bool) -> None:
    holders = s.holders
    for page in pages:
        del holders[page]
    s.free_pages = s.free_pages.push_head(pages) if at_head else s.free_pages.push_tail(pages)
    if s.touched is not None:
        s.touched.pages.update(pages)


@rule(Free)
def free(s: Any, event: Free) -> None:
    pages = event.pages
    check_distinct(pages, "page")  # a duplicate inside one free is a double free
    for page in pages:
        held = _check_freeable(s, page)
        if held != (DETACHED,):
            raise Reject(f"page {page} is still held by request(s) {list(held)}; "
                         "release it from the request first")
    _release(s, pages, event.at_head)


@rule(FreeMapped)
def free_mapped(s: Any, event: FreeMapped) -> None:
    pages = event.pages
    check_distinct(pages, "page")
    owners: dict[RequestId, set[int]] = {}
    for page in pages:
        held = _check_freeable(s, page)
        if len(held) != 1 or held == (DETACHED,) or held[0] not in s.requests:
            raise Reject(f"page {page} is held by {list(held)}, not by one request alone")
        owners.setdefault(held[0], set()).add(page)
    _release(s, pages, event.at_head)
    for request_id, gone in owners.items():
        record = s.request_w(request_id)
        dangling = set(record.dangling)
        dangling.update(i for i, page in enumerate(record.pages) if page in gone)
        record.dangling = tuple(sorted(dangling))
    if s.touched is not None:
        for request_id in owners:
            s.touched.table(request_id, 0)


@rule(Share)
def share(s: Any, event: Share) -> None:
    request_id, start, slots = event.request, event.start, event.slots
    check_request(s, request_id)
    record = s.requests[request_id]
    size = s.geometry.page_size
    if start != record.allocated or start % size:
        raise Reject(f"share must start at the request's page-aligned end {record.allocated}, "
                     f"got {start}")
    if start + len(slots) > s.geometry.row_width:
        raise Reject(f"share past the row width {s.geometry.row_width}")
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
    already = set(live_entries(record.pages, record.dangling)).intersection(pages)
    if already:
        raise Reject(f"page {min(already)} is already in request {request_id!r}'s table")
    holders = s.holders
    for page in pages:
        held = holders.get(page, ())
        if page not in s.page_node and not held:
            check_page_id(s, page)
            raise Reject(f"page {page} is free; share only pages someone holds")
        if held == (DETACHED,):
            raise Reject(f"page {page} is DETACHED; write it with Assign instead")
        if request_id in held:
            raise Reject(f"request {request_id!r} already holds page {page}")
    for page in pages:
        holders[page] = (*holders.get(page, ()), request_id)
    record = s.request_w(request_id)
    if s.touched is not None:
        s.touched.pages.update(pages)
        s.touched.table(request_id, len(record.pages))
    record.pages.extend(pages)
    record.allocated = start + len(slots)


@rule(Copy)
def copy(s: Any, event: Copy) -> None:
    if len(event.src_pages) != len(event.dst_pages):
        raise Reject("copy needs one destination page per source page")
    check_distinct(event.dst_pages, "destination page")
    for page in event.src_pages:
        check_page_id(s, page)
        if page not in s.page_node and page not in s.holders:
            raise Reject(f"copy source page {page} is free")
    for page in event.dst_pages:
        check_page_id(s, page)
        if s.holders.get(page) != (DETACHED,):
            raise Reject(f"copy destination page {page} must be freshly allocated (DETACHED)")
    if set(event.src_pages) & set(event.dst_pages):
        raise Reject("copy source and destination overlap")
