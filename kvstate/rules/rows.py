"""Rules for request rows, named requests and resets.

Rows ``1..num_rows`` are handed out from the top of a stack and reused
last-freed first (SGLang 0.5.23); named (``str``) requests need no row.
Closing a request never frees KV by itself: the pages only it held become
DETACHED, for the caller to free or insert.
"""

from __future__ import annotations

from typing import Any

from kvstate.events import ReqAlloc, ReqFree, Reset
from kvstate.records import MNode, RequestId
from kvstate.rules.common import check_distinct, check_request, live_entries, release_pages
from kvstate.rules.mamba_clauses import release_row, reset_tree_states
from kvstate.rules.registry import Reject, rule
from kvstate.state import ROOT


@rule(ReqAlloc, modes=("radix", "block"))
def req_alloc(s: Any, event: ReqAlloc) -> None:
    check_distinct(event.requests, "request")
    rows = []
    for request_id in event.requests:
        if isinstance(request_id, str):
            if request_id in s.requests:
                raise Reject(f"request {request_id!r} is already open")
            continue
        if request_id == 0:
            raise Reject("row 0 is the reserved padding row")
        if not 1 <= request_id <= s.geometry.num_rows:
            raise Reject(f"row {request_id} is outside 1..{s.geometry.num_rows}")
        if request_id not in s.free_rows:
            raise Reject(f"row {request_id} is already allocated")
        rows.append(request_id)
    generation = s.row_generation
    for row in rows:
        generation[row] = generation.get(row, 0) + 1
    for request_id in event.requests:
        s.open_request(request_id)
    if rows:
        s.free_rows = s.free_rows.take(rows)
    if s.touched is not None:
        for request_id in event.requests:
            s.touched.table(request_id, 0)


@rule(ReqFree, modes=("radix", "block"))
def req_free(s: Any, event: ReqFree) -> None:
    check_distinct(event.requests, "request")
    for request_id in event.requests:
        check_request(s, request_id)
    _close(s, event.requests)


def _close(s: Any, request_ids: tuple[RequestId, ...] | list[RequestId]) -> None:
    """Close open requests (already checked): release holds, push rows back on the stack."""
    touched = s.touched
    for request_id in request_ids:
        record = s.requests[request_id]
        table = live_entries(record.pages, record.dangling)
        release_pages(s, request_id, table)
        release_row(s, request_id)
        s.close_request(request_id)
        if touched is not None:
            touched.pages.update(table)
    freed_rows = [r for r in request_ids if isinstance(r, int)]
    if freed_rows:
        # Rows go back on top of the stack in the order given: the last one is reused first.
        s.free_rows = s.free_rows.push_head(freed_rows[::-1])
    if touched is not None:
        for request_id in request_ids:
            touched.table(request_id, 0)


@rule(Reset, modes=("radix", "block"))
def reset(s: Any, event: Reset) -> None:
    """``tree``: drop every node, freeing tree pages no one else holds (tail, ascending).
    ``rows``: close every request (their own pages become DETACHED).
    ``pages``: all pages free in order 1..N; needs an empty tree and no open request.
    ``all``: back to the initial state, keeping the clock and node ids monotone.
    With an SWA pool, the tree's SWA pages go back with the tree (tail, in
    ascending order) and ``pages`` / ``all`` free the whole pool.  With a
    Mamba pool, likewise the tree's states (tail, ascending slots); closed
    rows' Mamba slots become DETACHED; ``pages`` / ``all`` free every slot.
    """
    scope = event.scope
    if scope == "tree":
        if s.geometry.mode == "block":
            raise Reject("block mode clears its prefix tree with BlockClear")
        if len(s.tree_refs):
            page = min(s.snapshot("tree_refs").keys())
            raise Reject(f"tree page {page} is still mapped by a request that does not hold it; "
                         "close or truncate those requests before resetting the tree")
    if scope == "pages":
        if len(s.nodes) > 1:
            raise Reject("reset the tree before the pages: tree nodes still hold pages")
        if len(s.requests) > 0:
            raise Reject("reset the rows before the pages: requests are still open")
    if scope == "all" and s.geometry.mode == "block":
        raise Reject("block mode clears its prefix tree with BlockClear")
    if s.touched is not None:
        s.touched.everything = True
    if scope in ("rows", "all"):
        _close(s, list(s.snapshot("requests").keys()))
        s.free_rows = s.new_queue(1, s.geometry.num_rows + 1, desc=True)
    if scope in ("tree", "all"):
        _reset_tree(s)
    if scope in ("pages", "all"):
        s.free_pages = s.new_queue(1, s.geometry.num_pages + 1)
        s.clear("holders")
        s.reset_swa()
        s.reset_mamba()


def _reset_tree(s: Any) -> None:
    holders = s.holders
    tree_pages = s.snapshot("page_node").keys()
    freed = sorted(p for p in tree_pages if p not in holders)
    pool = s.swa
    if pool is not None:
        peer = pool.peer
        released = sorted(peer.pop(page) for page in tree_pages if page in peer)
        pool.free_pages = pool.free_pages.push_tail(released)
        pool.evictable = pool.protected = 0
    reset_tree_states(s)
    root = s.nodes[ROOT]
    for node_id in [n for n in s.snapshot("nodes").keys() if n != ROOT]:
        s.drop_node(node_id)
    s.add_node(ROOT, MNode(-1, (), (), s.new_children(), 1, root.last_access))
    s.clear("page_node")
    s.clear("leaves")
    s.free_pages = s.free_pages.push_tail(freed)
    s.evictable_size = 0
    s.protected_size = 0
    if s.host is not None:
        s.reset_host()
