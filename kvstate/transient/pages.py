"""Transient rules for pages and request tables (mirrors ``kvstate.reducer.pages``).

Every rule has the same shape: ``rule(ts, event) -> bool``.  It first checks
every precondition without writing anything; ``False`` means "not taken here"
(the event is invalid, or a case this fast path leaves to the pure reducer)
and ``ts`` is untouched.  Only after all checks pass does it mutate ``ts`` in
place and return ``True``.  Token range ownership is the pure reducer's::

    positions  0 ........ k*P ........ allocated
               | tree pages | own pages (last one may be partial)
"""

from __future__ import annotations

from kvstate.events import Allocate, Append, Assign, Copy, Free, Share, Truncate
from kvstate.reducer.common import bump_counts, drop_holds, unheld_tree_pages
from kvstate.state import DETACHED, RequestId, expand_pages
from kvstate.transient.state import TransientState, TRequest


def _owns_partial(ts: TransientState, request_id: RequestId, record: TRequest) -> int | None:
    """The request's partial last page if it holds it alone, outside the tree."""
    partial = record.pages[-1]
    if ts.holders.get(partial) != (request_id,) or partial in ts.page_node:
        return None
    return partial


def allocate(ts: TransientState, event: Allocate) -> bool:
    pages = event.pages
    queued = ts.free_pages.order
    if len(set(pages)) != len(pages) or any(page not in queued for page in pages):
        return False
    holders = ts.holders
    if not event.items:
        for page in pages:
            del queued[page]
            holders[page] = (DETACHED,)
        return True
    items = event.items
    if len({request_id for request_id, _ in items}) != len(items):
        return False  # one request twice in an event: leave the sequential reading to the reducer
    size = ts.geometry.page_size
    width = ts.geometry.row_width
    requests = ts.requests
    fresh = set(pages)
    used: set[int] = set()
    plan: list[tuple[RequestId, TRequest, list[int], int]] = []
    for request_id, slots in items:
        record = requests.get(request_id)
        if record is None:
            return False
        if not slots:
            continue
        position = record.allocated
        count = len(slots)
        if position + count > width:
            return False
        offset = position % size
        if offset and count == 1:  # decode: one token into the request's own partial page
            partial = _owns_partial(ts, request_id, record)
            if partial is None or slots[0] != partial * size + offset:
                return False
            plan.append((request_id, record, [], position + 1))
            continue
        head = (size - offset) % size  # slots that continue the current partial page
        new_pages = [slot // size for slot in slots[head::size]]
        if head:
            partial = _owns_partial(ts, request_id, record)
            if partial is None:
                return False
            first_slot = partial * size + offset
            continues = slots[:head]
            if continues != tuple(range(first_slot, first_slot + len(continues))):
                return False
        if new_pages and expand_pages(new_pages, size)[: count - head] != slots[head:]:
            return False
        for page in new_pages:
            if page not in fresh or page in used:
                return False
            used.add(page)
        plan.append((request_id, record, new_pages, position + count))
    if used != fresh:
        return False
    # every item passed: now write
    for page in pages:
        del queued[page]
    for request_id, record, new_pages, allocated in plan:
        if new_pages:
            for page in new_pages:
                holders[page] = (request_id,)
            record.pages.extend(new_pages)
        record.allocated = allocated
    return True


def append(ts: TransientState, event: Append) -> bool:
    items = event.items
    requests = ts.requests
    if len({request_id for request_id, _ in items}) != len(items):
        return False
    for request_id, committed in items:
        record = requests.get(request_id)
        if record is None or committed > record.allocated or committed < record.committed:
            return False
    for request_id, committed in items:
        requests[request_id].committed = committed
    return True


def assign(ts: TransientState, event: Assign) -> bool:
    request_id, start, slots = event.request, event.start, event.slots
    record = ts.requests.get(request_id)
    if record is None or start < 0 or start > record.allocated:
        return False
    size = ts.geometry.page_size
    stop = start + len(slots)
    if stop > ts.geometry.row_width:
        return False
    if not slots:
        return True
    allocated = max(record.allocated, stop)
    first, last = start // size, (stop - 1) // size
    written = [slots[max(index * size, start) - start] // size for index in range(first, last + 1)]
    if expand_pages(written, size)[start - first * size: stop - first * size] != slots:
        return False
    old_pages = record.pages
    if len(set(written)) != len(written) \
            or (set(old_pages[:first]) | set(old_pages[last + 1:])).intersection(written):
        return False  # a page would appear twice in the table
    if old_pages[first: last + 1] == written:
        # Rewriting the pages already there (the row rebind after an insert): only lengths change.
        record.allocated = allocated
        record.committed = min(record.committed, allocated)
        return True
    for index in {first, last}:  # a partly written page must stay the same page
        if index < len(old_pages):
            page_start = index * size
            covers_page = start <= page_start and min(page_start + size, allocated) <= stop
            if old_pages[index] != written[index - first] and not covers_page:
                return False
    replaced = old_pages[first: last + 1]
    holders, page_node = ts.holders, ts.page_node
    before, kept = set(replaced), set(written)
    claimed = []
    referenced = []  # tree pages the request will map without holding them
    for page in written:
        if page in before:
            continue
        held = holders.get(page, ())
        if page in page_node:
            if request_id not in held:
                referenced.append(page)
            continue
        if request_id in held:
            continue
        if held != (DETACHED,):
            return False
        claimed.append(page)
    dropped = [p for p in replaced if p not in kept]
    unreferenced = unheld_tree_pages(ts, request_id, dropped)
    bump_counts(ts.tree_refs, referenced, +1)
    bump_counts(ts.tree_refs, unreferenced, -1)
    for page in claimed:
        holders[page] = (request_id,)
    drop_holds(ts.holders, ts.page_node, request_id, dropped)
    record.pages = [*old_pages[:first], *written, *old_pages[last + 1:]]
    record.allocated = allocated
    record.committed = min(record.committed, allocated)
    return True


def truncate(ts: TransientState, event: Truncate) -> bool:
    record = ts.requests.get(event.request)
    if record is None or not 0 <= event.length <= record.allocated:
        return False
    keep = -(-event.length // ts.geometry.page_size)
    kept_pages = record.pages[:keep]
    kept = set(kept_pages)
    dropped = [p for p in record.pages[keep:] if p not in kept]
    bump_counts(ts.tree_refs, unheld_tree_pages(ts, event.request, dropped), -1)
    drop_holds(ts.holders, ts.page_node, event.request, dropped)
    record.pages = kept_pages
    record.allocated = event.length
    record.committed = min(record.committed, event.length)
    return True


def free(ts: TransientState, event: Free) -> bool:
    pages = event.pages
    if len(set(pages)) != len(pages):
        return False
    holders, page_node = ts.holders, ts.page_node
    for page in pages:
        if holders.get(page) != (DETACHED,) or page in page_node:
            return False
    for page in pages:
        del holders[page]
    if event.at_head:
        ts.free_pages.push_head(pages)
    else:
        ts.free_pages.push_tail(pages)
    return True


def share(ts: TransientState, event: Share) -> bool:
    request_id, start, slots = event.request, event.start, event.slots
    record = ts.requests.get(request_id)
    size = ts.geometry.page_size
    if record is None or start != record.allocated or start % size:
        return False
    if start + len(slots) > ts.geometry.row_width:
        return False
    pages: list[int] = []
    for position, slot in enumerate(slots, start):
        page, offset = divmod(slot, size)
        if offset != position % size:
            return False
        if offset == 0:
            pages.append(page)
        elif not pages or pages[-1] != page:
            return False
    if len(set(pages)) != len(pages) or set(record.pages).intersection(pages):
        return False
    holders, page_node = ts.holders, ts.page_node
    for page in pages:
        held = holders.get(page, ())
        if (page not in page_node and not held) or held == (DETACHED,) or request_id in held:
            return False
    for page in pages:
        holders[page] = (*holders.get(page, ()), request_id)
    record.pages.extend(pages)
    record.allocated = start + len(slots)
    return True


def copy(ts: TransientState, event: Copy) -> bool:
    """No state change; only the reducer's checks."""
    src, dst = event.src_pages, event.dst_pages
    num_pages = ts.geometry.num_pages
    if len(src) != len(dst) or len(set(dst)) != len(dst) or set(src) & set(dst):
        return False
    for page in src:
        if not 1 <= page <= num_pages or (page not in ts.page_node and page not in ts.holders):
            return False
    return all(1 <= page <= num_pages and ts.holders.get(page) == (DETACHED,) for page in dst)
