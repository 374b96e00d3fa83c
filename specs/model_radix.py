"""The model's rules for rows and pages (radix mode; rows also serve block mode).

Written from docs/design.md and the event docstrings (``kvstate.events.radix``).
Decisions where the text leaves room are listed in specs/SPEC.md:

* a request's table never maps one page at two page indices (two positions
  would share a slot);
* a token is only appended into a partial page the request holds alone and
  outside the tree;
* a *dangling* entry (its page freed by ``FreeMapped`` while the row still
  maps it) maps nothing: it is not held, it does not count as a mapping, and
  it stays until the row is rewritten there, truncated or closed.
"""

from __future__ import annotations

from typing import Any

from specs.model_state import (
    DETACHED,
    Holder,
    ModelState,
    MRequest,
    distinct,
    drop_hold,
    open_request,
    push,
    require,
    valid_page,
)


def referenced_tree_pages(m: ModelState) -> set[int]:
    """Tree pages some open request maps without holding them."""
    owner = m.tree_page_owner()
    return {page for rid, req in m.requests.items() for page in req.mapped()
            if page in owner and rid not in m.holders.get(page, ())}


def injective(pages: list[int]) -> None:
    require(len(pages) == len(set(pages)), "one page at two page indices of a table (slot collision)")


# -- rows ---------------------------------------------------------------------------
def req_alloc(m: ModelState, e: Any) -> None:
    distinct(e.requests, "request")
    for rid in e.requests:
        if isinstance(rid, str):
            require(rid not in m.requests, f"{rid!r} already open")
        else:
            require(1 <= rid <= m.num_rows, f"row {rid} not in 1..{m.num_rows}")
            require(rid in m.free_rows, f"row {rid} is taken")
    for rid in e.requests:
        m.requests[rid] = MRequest([])
        if isinstance(rid, int):
            m.free_rows.remove(rid)
            m.generation[rid] = m.generation.get(rid, 0) + 1


def close(m: ModelState, requests: list[Holder]) -> None:
    for rid in requests:
        for page in m.requests[rid].mapped():
            drop_hold(m, rid, page)
    for rid in requests:
        del m.requests[rid]


def req_free(m: ModelState, e: Any) -> None:
    distinct(e.requests, "request")
    for rid in e.requests:
        open_request(m, rid)
    close(m, list(e.requests))
    rows = [r for r in e.requests if isinstance(r, int)]
    m.free_rows = list(reversed(rows)) + m.free_rows


# -- pages ----------------------------------------------------------------------------
def allocate(m: ModelState, e: Any) -> None:
    distinct(e.pages, "page")
    for page in e.pages:
        require(page in m.free, f"page {page} is not free")
    for page in e.pages:
        m.free.remove(page)
    if not e.items:
        for page in e.pages:
            m.holders[page] = {DETACHED}
        return
    size = m.page_size
    unused = list(e.pages)
    for rid, slots in e.items:
        req = open_request(m, rid)
        require(req.allocated + len(slots) <= m.row_width, "past the row width")
        for slot in slots:
            page, offset = divmod(slot, size)
            position = req.allocated
            require(offset == position % size, f"slot {slot} breaks slot % P == pos % P")
            if offset == 0:
                require(page in unused, f"page {page} is not a fresh page of this event")
                unused.remove(page)
                m.holders[page] = {rid}
                req.pages.append(page)
            else:
                last = len(req.pages) - 1
                require(req.pages[last] == page, f"slot {slot} is not in the partial page")
                require(last not in req.dangling, f"partial page {page} was freed under the row")
                require(m.holders.get(page) == {rid} and page not in m.tree_page_owner(),
                        f"partial page {page} is not {rid!r}'s alone")
            req.allocated += 1
    require(not unused, f"pages {unused} allocated but never mapped")


def append(m: ModelState, e: Any) -> None:
    distinct([rid for rid, _ in e.items], "request")
    for rid, committed in e.items:
        req = open_request(m, rid)
        require(req.committed <= committed <= req.allocated, f"commit {committed} out of range")
        req.committed = committed


def assign(m: ModelState, e: Any) -> None:
    write(m, e.request, e.start, tuple(e.slots))


def write(m: ModelState, request: Holder, start: int, slots: tuple[int, ...]) -> None:
    """Write ``slots`` at ``start`` of ``request``'s table (``Assign``; one item of ``Scatter``)."""
    req = open_request(m, request)
    size, stop = m.page_size, start + len(slots)
    require(0 <= start <= req.allocated, f"write at {start} leaves a gap")
    require(stop <= m.row_width, "past the row width")
    allocated = max(req.allocated, stop)
    pages = list(req.pages)
    dangling = set(req.dangling)
    written: dict[int, int] = {}
    for position, slot in zip(range(start, stop), slots, strict=True):
        page, offset = divmod(slot, size)
        require(offset == position % size, f"slot {slot} breaks slot % P == pos % P")
        valid_page(m, page)
        index = position // size
        require(written.setdefault(index, page) == page, f"page index {index} gets two pages")
        if index < len(pages):
            whole = start <= index * size and min(index * size + size, allocated) <= stop
            require(pages[index] == page or whole, f"page index {index} would be split")
            pages[index] = page
        else:
            pages.append(page)
        dangling.discard(index)  # rewritten: the entry maps its page again
    before = req.mapped()
    after = [page for index, page in enumerate(pages) if index not in dangling]
    injective(after)
    owner = m.tree_page_owner()
    for page in after:
        if page in before or page in owner:
            continue
        require(m.holders.get(page) == {DETACHED}, f"page {page} is not DETACHED")
        m.holders[page] = {request}
    for page in before:
        if page not in after:
            drop_hold(m, request, page)
    req.pages, req.allocated, req.dangling = pages, allocated, sorted(dangling)
    req.committed = min(req.committed, allocated)


def scatter(m: ModelState, e: Any) -> None:
    """One-slot writes to distinct requests, in item order, all or nothing."""
    distinct([rid for rid, _, _ in e.items], "request")
    for rid, position, slot in e.items:
        write(m, rid, position, (slot,))


def share(m: ModelState, e: Any) -> None:
    req = open_request(m, e.request)
    size = m.page_size
    require(e.start == req.allocated and e.start % size == 0, "share must start at the aligned end")
    require(e.start + len(e.slots) <= m.row_width, "past the row width")
    pages: list[int] = []
    for position, slot in zip(range(e.start, e.start + len(e.slots)), e.slots, strict=True):
        page, offset = divmod(slot, size)
        require(offset == position % size, f"slot {slot} breaks slot % P == pos % P")
        if offset == 0:
            pages.append(page)
        else:
            require(bool(pages) and pages[-1] == page, f"slot {slot} leaves the shared page")
    distinct(pages, "page")
    owner = m.tree_page_owner()
    for page in pages:
        held = m.holders.get(page, set())
        require(page in owner or bool(held), f"page {page} is free")
        require(held != {DETACHED}, f"page {page} is DETACHED")
        require(e.request not in held, f"page {page} already held")
    injective(req.mapped() + pages)
    for page in pages:
        m.holders.setdefault(page, set()).add(e.request)
    req.pages.extend(pages)
    req.allocated += len(e.slots)


def truncate(m: ModelState, e: Any) -> None:
    req = open_request(m, e.request)
    require(0 <= e.length <= req.allocated, "truncate out of range")
    keep = -(-e.length // m.page_size)
    dropped = [page for index, page in enumerate(req.pages)
               if index >= keep and index not in req.dangling]
    for page in dropped:
        drop_hold(m, e.request, page)
    req.pages = req.pages[:keep]
    req.dangling = [index for index in req.dangling if index < keep]
    req.allocated = e.length
    req.committed = min(req.committed, e.length)


def _freeable(m: ModelState, page: int) -> None:
    valid_page(m, page)
    require(page not in m.tree_page_owner(), f"page {page} is a tree page")


def free(m: ModelState, e: Any) -> None:
    distinct(e.pages, "page")
    for page in e.pages:
        _freeable(m, page)
        require(m.holders.get(page) == {DETACHED}, f"page {page} is not DETACHED")
    for page in e.pages:
        del m.holders[page]
    m.free = push(m.free, list(e.pages), e.at_head)


def free_mapped(m: ModelState, e: Any) -> None:
    """Free pages one open request holds alone; its entries for them become dangling."""
    distinct(e.pages, "page")
    owners: dict[int, Holder] = {}
    for page in e.pages:
        _freeable(m, page)
        held = m.holders.get(page, set())
        require(len(held) == 1 and DETACHED not in held, f"page {page} is not one request's alone")
        (rid,) = held
        require(rid in m.requests, f"page {page} is held by closed request {rid!r}")
        owners[page] = rid
    for page, rid in owners.items():
        del m.holders[page]
        req = m.requests[rid]
        gone = {index for index, p in enumerate(req.pages) if p == page}
        req.dangling = sorted(set(req.dangling) | gone)
    m.free = push(m.free, list(e.pages), e.at_head)


def copy(m: ModelState, e: Any) -> None:
    require(len(e.src_pages) == len(e.dst_pages), "copy needs as many destinations as sources")
    distinct(e.dst_pages, "destination page")
    owner = m.tree_page_owner()
    for page in e.src_pages:
        valid_page(m, page)
        require(page in owner or page in m.holders, f"copy source {page} is free")
    for page in e.dst_pages:
        valid_page(m, page)
        require(m.holders.get(page) == {DETACHED}, f"copy destination {page} is not DETACHED")
    require(not set(e.src_pages) & set(e.dst_pages), "copy source and destination overlap")
