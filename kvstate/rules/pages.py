"""Rules for pages and request tables: allocate, append, assign, scatter, truncate.

Token range ownership inside one request's table (P = page size)::

    positions  0 ........ k*P ........ allocated ....... row_width
               | tree pages | own pages | (unmapped)
                 referenced   held by the request; the last one may be partial

Only ``Allocate`` takes pages off the free list and only ``Free`` and
``Evict`` put pages back (``kvstate.rules.frees``, ``kvstate.rules.tree``),
so every move of a page is visible in the event stream.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from kvstate.events import Allocate, Append, Assign, Scatter, Truncate
from kvstate.records import RequestId
from kvstate.rules.common import (
    bump_counts,
    check_distinct,
    check_page_id,
    check_request,
    live_entries,
    release_pages,
)
from kvstate.rules.registry import Reject, rule
from kvstate.state import DETACHED, expand_pages

_DETACHED_HOLD = (DETACHED,)


@rule(Allocate)
def allocate(s: Any, event: Allocate) -> None:
    pages = event.pages
    check_distinct(pages, "page")
    queue = s.free_pages
    taken = queue.missing(pages)
    if taken is not None:
        check_page_id(s, taken)
        raise Reject(f"page {taken} is not free (allocating a taken page)")
    holders = s.holders
    if not event.items:
        s.free_pages = queue.take(pages)
        for page in pages:
            holders[page] = (DETACHED,)
        if s.touched is not None:
            s.touched.pages.update(pages)
        return
    plan = _plan_one_each(s, event)
    if plan is None:  # a request with several items: check them in sequence
        plan = _plan_items(s, event)
    s.free_pages = queue.take(pages)
    touched = s.touched
    for request_id, new_pages, allocated in plan:
        record = s.request_w(request_id)
        if touched is not None:
            touched.table(request_id, len(record.pages))
        if new_pages:
            held = (request_id,)
            for page in new_pages:
                holders[page] = held
            record.pages.extend(new_pages)
        record.allocated = allocated
    if touched is not None:
        touched.pages.update(pages)


def _plan_one_each(s: Any, event: Allocate) -> list[tuple[RequestId, Any, int]] | None:
    """``_plan_items`` for the usual batch (each request once; one-slot items inline, as a
    decode step has); ``None`` when a request has several items."""
    size = s.geometry.page_size
    width = s.geometry.row_width
    requests = s.requests
    fresh = set(event.pages)
    used: set[int] = set()
    seen: set[RequestId] = set()
    plan: list[tuple[RequestId, Any, int]] = []
    for request_id, slots in event.items:
        if request_id in seen:
            return None
        seen.add(request_id)
        record = requests.get(request_id)
        if record is None:
            raise Reject(f"unknown request {request_id!r}")
        if len(slots) != 1:
            if slots:
                plan.extend(_plan_items(s, Allocate((), ((request_id, slots),)), fresh, used))
            continue
        position = record.allocated
        if position >= width:
            raise Reject(f"request {request_id!r} would map {position + 1} tokens,"
                         f" past the row width {width}")
        slot = slots[0]
        offset = position % size
        if offset:  # continues the request's own partial page
            partial = _own_partial_page(s, request_id, record, position)
            if slot != partial * size + offset:
                _explain_slots(slots, (partial * size + offset,), position, size)
            plan.append((request_id, (), position + 1))
            continue
        page = slot // size
        if slot % size:
            _explain_slots(slots, (page * size,), position, size)
        if page not in fresh or page in used:
            raise Reject(f"page {page} must be newly allocated in this event "
                         "(once) to start a page")
        used.add(page)
        plan.append((request_id, (page,), position + 1))
    if used != fresh:
        raise Reject(f"pages {sorted(fresh - used)} were allocated but mapped by no item")
    return plan


def _plan_items(s: Any, event: Allocate, fresh: set[int] | None = None,
                used: set[int] | None = None) -> list[tuple[RequestId, list[int], int]]:
    """Check every item against the state as it would be item by item (reads only)."""
    size = s.geometry.page_size
    width = s.geometry.row_width
    requests = s.requests
    whole = fresh is None  # False: one item checked for _plan_one_each, sharing its page sets
    fresh = set(event.pages) if fresh is None else fresh
    used = set() if used is None else used
    lengths: dict[RequestId, int] = {}  # an item may follow another of the same request
    opened: dict[RequestId, int] = {}  # the last page an earlier item opened, per request
    plan: list[tuple[RequestId, list[int], int]] = []
    for request_id, slots in event.items:
        record = requests.get(request_id)
        if record is None:
            raise Reject(f"unknown request {request_id!r}")
        if not slots:
            continue
        position = lengths.get(request_id, record.allocated)
        count = len(slots)
        if position + count > width:
            raise Reject(f"request {request_id!r} would map {position + count} tokens,"
                         f" past the row width {width}")
        offset = position % size
        if offset and count == 1:
            # Decode fast path: one token continuing the request's own partial page.
            partial = opened.get(request_id) or _own_partial_page(s, request_id, record, position)
            if slots[0] != partial * size + offset:
                _explain_slots(slots, (partial * size + offset,), position, size)
            plan.append((request_id, [], position + 1))
            lengths[request_id] = position + 1
            continue
        head = (size - offset) % size  # slots that continue the current partial page
        new_pages = [slot // size for slot in slots[head::size]]
        if head:
            partial = opened.get(request_id) or _own_partial_page(s, request_id, record, position)
            first_slot = partial * size + offset
            continues = tuple(slots[:head])
            if continues != tuple(range(first_slot, first_slot + len(continues))):
                _explain_slots(slots, expand_pages([partial, *new_pages], size)[offset:],
                               position, size)
        if new_pages and expand_pages(new_pages, size)[: count - head] != tuple(slots[head:]):
            _explain_slots(slots, (tuple(slots[:head]) + expand_pages(new_pages, size)),
                           position, size)
        for page in new_pages:
            if page not in fresh or page in used:
                raise Reject(f"page {page} must be newly allocated in this event "
                             "(once) to start a page")
            used.add(page)
        plan.append((request_id, new_pages, position + count))
        lengths[request_id] = position + count
        if new_pages:
            opened[request_id] = new_pages[-1]
    if whole and used != fresh:
        raise Reject(f"pages {sorted(fresh - used)} were allocated but mapped by no item")
    return plan


def _own_partial_page(s: Any, request_id: RequestId, record: Any, position: int) -> int:
    """The request's partial last page; it must hold it alone, outside the tree."""
    index = position // s.geometry.page_size
    partial = record.pages[index] if index < len(record.pages) else 0
    if (s.holders.get(partial) != (request_id,) or partial in s.page_node
            or index in record.dangling):
        raise Reject(f"request {request_id!r} must hold its partial page {partial} "
                     "alone to append into it (shared pages need copy-on-write)")
    return int(partial)


def _explain_slots(slots: Any, expected: tuple[int, ...], position: int, size: int) -> None:
    """Raise a precise rejection for the first slot that breaks the page geometry."""
    for index, (slot, want) in enumerate(zip(slots, expected, strict=False)):
        if slot != want:
            at = position + index
            if slot % size != at % size:
                raise Reject(f"slot {slot} at position {at} breaks slot % P == pos % P")
            raise Reject(f"slot {slot} at position {at} is not in the page that position "
                         f"maps to (expected slot {want})")
    raise Reject("slots do not cover the positions they are written to")


@rule(Append)
def append(s: Any, event: Append) -> None:
    check_distinct([request_id for request_id, _ in event.items], "request")
    for request_id, committed in event.items:
        record = s.requests.get(request_id)
        if record is None:
            raise Reject(f"unknown request {request_id!r}")
        if committed > record.allocated:
            raise Reject(f"append to {committed} tokens is beyond the {record.allocated} "
                         f"allocated slots of request {request_id!r}")
        if committed < record.committed:
            raise Reject(f"append cannot lower committed tokens of {request_id!r} "
                         f"from {record.committed} to {committed}")
    touched = s.touched
    for request_id, committed in event.items:
        record = s.request_w(request_id)
        record.committed = committed
        if touched is not None:
            touched.table(request_id, len(record.pages))


@rule(Assign)
def assign(s: Any, event: Assign) -> None:
    check_request(s, event.request)
    write = _plan_write(s, event.request, event.start, tuple(event.slots), s.requests[event.request])
    if write is not None:
        _do_write(s, event.request, write)


@rule(Scatter)
def scatter(s: Any, event: Scatter) -> None:
    """One-slot writes to distinct requests; every item is checked before any is written.

    The decode shape (a slot at the end of a row, in its own partial page or
    starting a DETACHED page) is checked inline; any other item takes the
    general write check.  No page may be taken by two items.
    """
    check_distinct([request_id for request_id, _, _ in event.items], "request")
    size, width = s.geometry.page_size, s.geometry.row_width
    requests, holders, page_node = s.requests, s.holders, s.page_node
    appends: list[tuple[RequestId, int, int]] = []  # (request, new page or 0, position)
    writes: list[tuple[RequestId, _Write]] = []
    taken: set[int] = set()
    for request_id, position, slot in event.items:
        record = requests.get(request_id)
        if record is None:
            raise Reject(f"unknown request {request_id!r}")
        if (position == record.allocated and position < width and not record.dangling
                and slot % size == position % size):
            page, index = slot // size, position // size
            pages = record.pages
            if position % size:
                if index < len(pages) and pages[index] == page:
                    appends.append((request_id, 0, position))
                    continue
            elif (index == len(pages) and holders.get(page) == _DETACHED_HOLD
                  and page not in page_node):
                if page in taken:
                    raise Reject(f"page {page} is written into two requests by one event")
                taken.add(page)
                appends.append((request_id, page, position))
                continue
        write = _plan_write(s, request_id, position, (slot,), record)
        if write is not None:
            if taken.intersection(write.gained):
                raise Reject(f"page {min(taken.intersection(write.gained))} is written into two "
                             "requests by one event")
            taken.update(write.gained)
            writes.append((request_id, write))
    request_w, touched = s.request_w, s.touched
    for request_id, page, position in appends:
        record = request_w(request_id)
        if page:
            holders[page] = (request_id,)
            record.pages.append(page)
            if touched is not None:
                touched.pages.add(page)
        if touched is not None:
            touched.table(request_id, position // size)
        record.allocated = position + 1
    for request_id, write in writes:
        _do_write(s, request_id, write)


class _Write(NamedTuple):
    """A checked table write: what changes, computed before anything is written."""

    first: int
    last: int
    written: list[int]
    allocated: int
    committed: int
    gained: list[int]
    released: list[int]
    referenced: list[int]
    dangling: tuple[int, ...]


def _plan_write(s: Any, request_id: RequestId, start: int, slots: tuple[int, ...],
                record: Any) -> _Write | None:
    size = s.geometry.page_size
    if start < 0 or start > record.allocated:
        raise Reject(f"write at {start} leaves a gap after {record.allocated} mapped tokens")
    stop = start + len(slots)
    if stop > s.geometry.row_width:
        raise Reject(f"write to position {stop} is past the row width {s.geometry.row_width}")
    if not slots:
        return None
    allocated = max(record.allocated, stop)
    first, last = start // size, (stop - 1) // size
    if size == 1:
        written = list(slots)
    else:  # the page of the first slot, then of each slot that starts a page
        written = [slots[0] // size]
        written += [slot // size for slot in slots[(first + 1) * size - start::size]]
        expected = expand_pages(written, size)[start - first * size: stop - first * size]
        if expected != tuple(slots):
            _explain_slots(slots, expected, start, size)
    kept = set(written)
    if len(kept) != len(written):
        check_distinct(written, "page")
    old_pages = record.pages
    dangling = record.dangling
    for index in {first, last}:  # a partly written page must stay the same page
        if index < len(old_pages):
            page_start = index * size
            covers_page = start <= page_start and min(page_start + size, allocated) <= stop
            if old_pages[index] != written[index - first] and not covers_page:
                raise Reject(f"write splits page index {index} between pages "
                             f"{old_pages[index]} and {written[index - first]}")
    replaced = live_entries(old_pages, dangling, first, min(last + 1, len(old_pages)))
    before = set(replaced)
    holders, page_node = s.holders, s.page_node
    gained: list[int] = []
    referenced: list[int] = []  # tree pages mapped without a hold: may not appear elsewhere
    for page in written:
        if page in before:
            continue
        held = holders.get(page)
        if held is not None and request_id in held:
            # It holds the page, so its table maps it already, outside the written range.
            raise Reject(f"page {page} would appear twice in request {request_id!r}'s table")
        if page in page_node:
            referenced.append(page)
        elif held == _DETACHED_HOLD:
            gained.append(page)
        else:
            check_page_id(s, page)
            raise Reject(f"page {page} is not allocated to request {request_id!r}"
                         f" (holders {list(held or ())})")
    if referenced:
        outside = set(live_entries(old_pages, dangling, 0, first))
        outside.update(live_entries(old_pages, dangling, last + 1))
        clash = outside.intersection(referenced)
        if clash:
            raise Reject(f"page {min(clash)} would appear twice in request {request_id!r}'s table")
    released = [p for p in replaced if p not in kept]
    new_dangling = tuple(i for i in dangling if not first <= i <= last) if dangling else ()
    return _Write(first=first, last=last, written=written, allocated=allocated,
                  committed=min(record.committed, allocated), gained=gained, released=released,
                  referenced=referenced, dangling=new_dangling)


def _do_write(s: Any, request_id: RequestId, write: _Write) -> None:
    holders = s.holders
    held = (request_id,)
    for page in write.gained:
        holders[page] = held
    if write.referenced:
        bump_counts(s.tree_refs, write.referenced, +1)
    if write.released:
        release_pages(s, request_id, write.released)
    record = s.request_w(request_id)
    record.pages[write.first: write.last + 1] = write.written
    record.allocated = write.allocated
    record.committed = write.committed
    record.dangling = write.dangling
    if s.touched is not None:
        s.touched.pages.update(write.written)
        s.touched.pages.update(write.released)
        s.touched.table(request_id, write.first)


@rule(Truncate)
def truncate(s: Any, event: Truncate) -> None:
    check_request(s, event.request)
    record = s.requests[event.request]
    if not 0 <= event.length <= record.allocated:
        raise Reject(f"truncate to {event.length} outside 0..{record.allocated}")
    keep = -(-event.length // s.geometry.page_size)
    kept = set(live_entries(record.pages, record.dangling, 0, keep))
    dropped = [p for p in live_entries(record.pages, record.dangling, keep) if p not in kept]
    release_pages(s, event.request, dropped)
    record = s.request_w(event.request)
    del record.pages[keep:]
    record.allocated = event.length
    record.committed = min(record.committed, event.length)
    record.dangling = tuple(i for i in record.dangling if i < keep)
    if s.touched is not None:
        s.touched.pages.update(dropped)
        s.touched.table(event.request, keep)
