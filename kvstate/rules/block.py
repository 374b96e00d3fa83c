"""Rules of the block-pool mode (vLLM V1) for block tables and holders: alloc, hold, release.

Every rule rejects a state whose geometry is not ``mode="block"``.  Page
life cycle in block mode::

    free (queued, no holder) --BlockAlloc--> held --BlockRelease--> free
      ^   (must be uncached)                 |  ^                    (head if uncached,
      |                                      |  |                     tail if cached)
      +------------ BlockHold (revive) ------+--+
    cached: orthogonal; BlockCache adds a held page as a copy of a tree node,
            BlockUncache / BlockClear remove it without moving the page
            (``kvstate.rules.block_tree``)
"""

from __future__ import annotations

from typing import Any

from kvstate.events import BlockAlloc, BlockHold, BlockRelease
from kvstate.records import RequestId
from kvstate.rules.common import check_distinct, check_page_id, check_request
from kvstate.rules.registry import Reject, rule
from kvstate.state import DETACHED


def _check_holder(s: Any, holder: RequestId) -> bool:
    """True for a request holder (which must be open), False for DETACHED."""
    if holder == DETACHED and not isinstance(holder, str):
        return False
    check_request(s, holder)
    return True


def _check_width(s: Any, request_id: RequestId, added: int) -> None:
    size = s.geometry.page_size
    mapped = (len(s.requests[request_id].pages) + added) * size
    if mapped > s.geometry.row_width:
        raise Reject(f"request {request_id!r} would map {mapped} tokens, "
                     f"past the row width {s.geometry.row_width}")


def _extend_table(s: Any, request_id: RequestId, pages: tuple[int, ...]) -> None:
    record = s.request_w(request_id)
    if s.touched is not None:
        s.touched.table(request_id, len(record.pages))
    record.pages.extend(pages)
    record.allocated = len(record.pages) * s.geometry.page_size


@rule(BlockAlloc, modes=("block",))
def block_alloc(s: Any, event: BlockAlloc) -> None:
    pages = event.pages
    is_request = _check_holder(s, event.holder)
    if not pages:
        return
    queue = s.free_pages
    head = queue.head(len(pages))
    if list(pages) != head:
        check_distinct(pages, "page")
        for page in pages:
            check_page_id(s, page)
            if page not in queue:
                raise Reject(f"page {page} is not free (allocating a held page)")
        raise Reject(f"pages {list(pages)} are not the head of the free queue {head}")
    page_node = s.page_node
    for page in pages:
        if page in page_node:
            raise Reject(f"page {page} is still cached (tree node {page_node[page]}); "
                         "uncache it before reuse")
    if is_request:
        _check_width(s, event.holder, len(pages))
    s.free_pages = queue.take_head(pages)
    held = (event.holder,)
    holders = s.holders
    for page in pages:
        holders[page] = held
    if is_request:
        _extend_table(s, event.holder, pages)
    if s.touched is not None:
        s.touched.pages.update(pages)


@rule(BlockHold, modes=("block",))
def block_hold(s: Any, event: BlockHold) -> None:
    holder, pages = event.holder, event.pages
    is_request = _check_holder(s, holder)
    real = [page for page in pages if page != 0] if 0 in pages else list(pages)
    if not is_request and len(real) != len(pages):
        raise Reject("the null page 0 can only pad a request table")
    holders = s.holders
    num_pages = s.geometry.num_pages
    if is_request:
        check_distinct(real, "page")
        # A request holds exactly the pages its table maps (``refcounts``,
        # ``table_refs_live``): the table alone says which it already holds.
        table = set(s.requests[holder].pages)
        for page in real:
            if not 0 < page <= num_pages:
                check_page_id(s, page)
            if page in table:
                raise Reject(f"request {holder!r} already holds page {page}")
        _check_width(s, holder, len(pages))
    elif real and (min(real) < 1 or max(real) > num_pages):
        for page in real:
            check_page_id(s, page)
    # Pages nobody held leave the free queue, once each (a pool-level holder may repeat one,
    # so holders are extended one by one).
    revived = []
    single = (holder,)
    held_by = holders.get
    for page in real:
        held = held_by(page)
        if held is None:
            revived.append(page)
            holders[page] = single
        else:
            holders[page] = held + single
    if revived:
        s.free_pages = s.free_pages.take(revived)
    if is_request:
        _extend_table(s, holder, pages)
    if s.touched is not None:
        s.touched.pages.update(real)


@rule(BlockRelease, modes=("block",))
def block_release(s: Any, event: BlockRelease) -> None:
    holder = event.holder
    is_request = _check_holder(s, holder)
    pages = event.pages
    real = pages if 0 not in pages else tuple([page for page in pages if page != 0])
    holders, page_node = s.holders, s.page_node
    if is_request and event.close:
        # The pages must be exactly the table's.  A table maps distinct pages
        # (``table_injective``), each held by its request (``table_refs_live``), so this
        # one comparison also rules out a duplicate and a page the request does not hold.
        table = s.requests[holder].pages
        mapped = table if 0 not in table else [page for page in table if page != 0]
        # the usual order is the table's, reversed (vLLM frees the tail first)
        if len(mapped) != len(real) or (mapped != list(reversed(real))
                                        and set(mapped) != set(real)):
            check_distinct(real, "page")  # name a double free as such
            raise Reject(f"closing request {holder!r} must release all its pages {mapped}")
    else:
        if event.close:
            raise Reject("close needs a request holder")
        check_distinct(real, "page")  # a duplicate inside one release is a double free
        held_by = holders.get
        for page in real:
            held = held_by(page)
            if held is None or holder not in held:
                check_page_id(s, page)
                state_word = "free (double free)" if held is None else f"held by {list(held)}"
                raise Reject(f"page {page} is not held by {holder!r}: it is {state_word}")
    to_head: list[int] = []
    to_tail: list[int] = []
    to_tail_if_cached = event.cached_to_tail
    for page in real:
        held = holders[page]
        if len(held) > 1:
            index = held.index(holder)
            holders[page] = held[:index] + held[index + 1:]
            continue
        del holders[page]
        if to_tail_if_cached and page in page_node:
            to_tail.append(page)
        else:
            to_head.append(page)
    if is_request:
        if event.close:
            s.close_request(holder)
            if isinstance(holder, int):  # the row goes back on top of the stack, as ReqFree does
                s.free_rows = s.free_rows.push_head([holder])
        else:
            record = s.request_w(holder)
            gone = set(real)
            record.pages[:] = [0 if page in gone else page for page in record.pages]
    if to_head:
        s.free_pages = s.free_pages.push_head(to_head)
    if to_tail:
        s.free_pages = s.free_pages.push_tail(to_tail)
    if s.touched is not None:
        s.touched.pages.update(real)
        if is_request:
            s.touched.table(holder, 0)
