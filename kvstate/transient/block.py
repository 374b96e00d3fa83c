"""Transient rules of the block-pool mode (mirrors ``kvstate.reducer.block``).

Same contract as the other transient rules: check everything first, then
mutate ``ts`` in place; ``False`` leaves it untouched and sends the event to
the pure reducer.  These rules are only registered for block-mode states
(``rules_for``), so they need no mode check of their own.  Page life cycle (vLLM V1)::

    free (queued, no holder) --BlockAlloc--> held --BlockRelease--> free
      ^                                      |  ^      (head if uncached, tail if cached)
      +------------ BlockHold (revive) ------+--+
    cached: a held page becomes a copy of a tree node (BlockCache) until
            BlockUncache / BlockClear; the page does not move when uncached
"""

from __future__ import annotations

from kvstate.events_block import (
    BlockAlloc,
    BlockCache,
    BlockClear,
    BlockHold,
    BlockRelease,
    BlockUncache,
)
from kvstate.reducer import Reject
from kvstate.reducer.block import drop_one_hold, resolve_cache_path
from kvstate.state import DETACHED, ROOT, RequestId, block_child_key
from kvstate.transient.state import TNode, TransientState


def _holder_kind(ts: TransientState, holder: RequestId) -> bool | None:
    """True: an open request; False: DETACHED; None: an unknown request (invalid)."""
    if holder == DETACHED and not isinstance(holder, str):
        return False
    return True if holder in ts.requests else None


def _table_fits(ts: TransientState, request_id: RequestId, added: int) -> bool:
    size, width = ts.geometry.page_size, ts.geometry.row_width
    return (len(ts.requests[request_id].pages) + added) * size <= width


def _extend_table(ts: TransientState, request_id: RequestId, pages: tuple[int, ...]) -> None:
    record = ts.requests[request_id]
    record.pages.extend(pages)
    record.allocated = len(record.pages) * ts.geometry.page_size


def block_alloc(ts: TransientState, event: BlockAlloc) -> bool:
    is_request = _holder_kind(ts, event.holder)
    pages = event.pages
    if is_request is None:
        return False
    if not pages:
        return True
    if list(pages) != ts.free_pages.head(len(pages)):
        return False
    page_node = ts.page_node
    if any(page in page_node for page in pages):
        return False
    if is_request and not _table_fits(ts, event.holder, len(pages)):
        return False
    held = (event.holder,)
    holders = ts.holders
    for page in pages:
        holders[page] = held
    ts.free_pages.take(pages)
    if is_request:
        _extend_table(ts, event.holder, pages)
    return True


def block_hold(ts: TransientState, event: BlockHold) -> bool:
    holder, pages = event.holder, event.pages
    is_request = _holder_kind(ts, holder)
    if is_request is None:
        return False
    real = [page for page in pages if page != 0]
    if not is_request and len(real) != len(pages):
        return False  # the null page only pads request tables
    table: set[int] = set()
    if is_request:
        if len(set(real)) != len(real):
            return False
        table = set(ts.requests[holder].pages)
    num_pages, holders, queued = ts.geometry.num_pages, ts.holders, ts.free_pages.order
    updated: dict[int, tuple[RequestId, ...]] = {}  # a pool-level hold may name a page twice
    revived: list[int] = []
    for page in real:
        if not 0 < page <= num_pages:
            return False
        held = updated[page] if page in updated else holders.get(page, ())
        if is_request and (holder in held or page in table):
            return False
        if not held:
            if page not in queued:
                return False  # an unheld page outside the queue: leave it to the reducer
            revived.append(page)
        updated[page] = (*held, holder)
    if is_request and not _table_fits(ts, holder, len(pages)):
        return False
    holders.update(updated)
    ts.free_pages.take(revived)
    if is_request:
        _extend_table(ts, holder, pages)
    return True


def block_release(ts: TransientState, event: BlockRelease) -> bool:
    holder = event.holder
    is_request = _holder_kind(ts, holder)
    real = [page for page in event.pages if page != 0]
    if is_request is None or len(set(real)) != len(real) or (event.close and not is_request):
        return False
    holders, page_node = ts.holders, ts.page_node
    for page in real:
        held = holders.get(page)
        if held is None or holder not in held:
            return False
    record = ts.requests[holder] if is_request else None
    if record is not None:
        if event.close:
            mapped = [page for page in record.pages if page != 0]
            if len(mapped) != len(real) or set(mapped) != set(real):
                return False
        elif not set(real) <= set(record.pages):
            return False  # not in the table: the reducer's own error
    to_head: list[int] = []
    to_tail: list[int] = []
    for page in real:
        drop_one_hold(holders, page_node, page, holder, event.cached_to_tail, to_head, to_tail)
    if record is not None:
        if event.close:
            del ts.requests[holder]
        else:
            position = {page: index for index, page in enumerate(record.pages) if page != 0}
            for page in real:
                record.pages[position[page]] = 0
    if to_head:
        ts.free_pages.push_head(to_head)
    if to_tail:
        ts.free_pages.push_tail(to_tail)
    return True


def block_cache(ts: TransientState, event: BlockCache) -> bool:
    nodes = ts.nodes
    entries, stored_from = event.entries, event.stored_from
    if event.parent not in nodes or not 0 <= stored_from <= len(entries):
        return False
    size, page_node = ts.geometry.page_size, ts.page_node
    try:
        keys, first_new, next_id, current = resolve_cache_path(
            nodes, ts.next_node_id, event, size, ts.geometry.num_pages, ts.holders, page_node)
    except Reject:
        return False
    # Pass 2: build (new nodes are created whole: their pages and their one child).
    for index in range(first_new):
        node_id, _key, _extra, page = entries[index]
        if page:
            target = nodes[node_id]
            target.pages = (*target.pages, page)
            target.frozen = None
            page_node[page] = node_id
    if first_new < len(entries):
        attach = entries[first_new - 1][0] if first_new else event.parent
        parent = nodes[attach]
        parent.children[keys[first_new]] = entries[first_new][0]
        parent.frozen = None
        last = len(entries) - 1
        for index in range(first_new, len(entries)):
            node_id, key, extra, page = entries[index]
            children = {keys[index + 1]: entries[index + 1][0]} if index < last else {}
            nodes[node_id] = TNode(attach, key, (page,) if page else (), children, 0, 0, extra)
            if page:
                page_node[page] = node_id
            attach = node_id
    pruned = _prune(ts, current)  # trailing positions that got no copy (null blocks)
    ts.evictable_size += (next_id - ts.next_node_id - pruned) * size
    ts.next_node_id = next_id
    return True


def _prune(ts: TransientState, node_id: int) -> int:
    """Delete ``node_id`` and its ancestors while they have no copy and no child; the count."""
    nodes = ts.nodes
    removed = 0
    current = node_id
    while current != ROOT:
        found = nodes.get(current)
        if found is None or found.pages or found.children:
            break
        parent = nodes[found.parent]
        del parent.children[block_child_key(found.key, found.extra)]
        parent.frozen = None
        del nodes[current]
        removed += 1
        current = found.parent
    return removed


def block_uncache(ts: TransientState, event: BlockUncache) -> bool:
    pages, node_ids = event.pages, event.nodes
    page_node = ts.page_node
    if len(pages) != len(node_ids) or len(set(pages)) != len(pages):
        return False
    if any(page_node.get(page) != node_id for page, node_id in zip(pages, node_ids, strict=True)):
        return False
    nodes = ts.nodes
    for page, node_id in zip(pages, node_ids, strict=True):
        node = nodes[node_id]
        node.pages = tuple(p for p in node.pages if p != page)
        node.frozen = None
        del page_node[page]
    removed = sum(_prune(ts, node_id) for node_id in dict.fromkeys(node_ids))
    ts.evictable_size -= removed * ts.geometry.page_size
    return True


def block_clear(ts: TransientState, event: BlockClear) -> bool:
    root = ts.nodes[ROOT]
    root.children = {}
    root.below = 0
    root.frozen = None
    ts.nodes = {ROOT: root}
    ts.page_node = {}
    ts.evictable_size = 0
    return True
