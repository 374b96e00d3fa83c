"""Reducer rules for request rows, named requests and resets."""

from __future__ import annotations

from immutables import Map

from kvstate.events import ReqAlloc, ReqFree, Reset
from kvstate.freequeue import FreeQueue
from kvstate.reducer import Reject, handles
from kvstate.reducer.common import (
    adjust_tree_refs,
    check_distinct,
    check_request,
    release_holds,
    unheld_tree_pages,
)
from kvstate.state import EMPTY_REQUEST, ROOT, Node, State


@handles(ReqAlloc)
def req_alloc(state: State, event: ReqAlloc) -> State:
    check_distinct(event.requests, "request")
    rows = []
    for request_id in event.requests:
        if isinstance(request_id, str):
            if request_id in state.requests:
                raise Reject(f"request {request_id!r} is already open")
            continue
        if request_id == 0:
            raise Reject("row 0 is the reserved padding row")
        if not 1 <= request_id <= state.geometry.num_rows:
            raise Reject(f"row {request_id} is outside 1..{state.geometry.num_rows}")
        if request_id not in state.free_rows:
            raise Reject(f"row {request_id} is already allocated")
        rows.append(request_id)
    generation = state.row_generation
    with generation.mutate() as gens:
        for row in rows:
            gens[row] = gens.get(row, 0) + 1
        generation = gens.finish()
    with state.requests.mutate() as requests:
        for request_id in event.requests:
            requests[request_id] = EMPTY_REQUEST
        new_requests = requests.finish()
    return state.with_changes(
        free_rows=state.free_rows.take(rows),
        row_generation=generation,
        requests=new_requests,
    )


@handles(ReqFree)
def req_free(state: State, event: ReqFree) -> State:
    check_distinct(event.requests, "request")
    for request_id in event.requests:
        check_request(state, request_id)
    holders = state.holders
    tree_refs = state.tree_refs
    for request_id in event.requests:
        table = state.requests[request_id].pages
        tree_refs = adjust_tree_refs(tree_refs, unheld_tree_pages(state, request_id, table), -1)
        holders = release_holds(holders, state.page_node, request_id, table)
    with state.requests.mutate() as requests:
        for request_id in event.requests:
            del requests[request_id]
        new_requests = requests.finish()
    freed_rows = [r for r in event.requests if isinstance(r, int)]
    # Rows go back on top of the stack in the order given: the last one is reused first.
    return state.with_changes(
        holders=holders,
        requests=new_requests,
        free_rows=state.free_rows.push_head(reversed(freed_rows)),
        tree_refs=tree_refs,
    )


@handles(Reset)
def reset(state: State, event: Reset) -> State:
    """``tree``: drop every node, freeing tree pages no one else holds (tail, ascending).
    ``rows``: close every request (their own pages become DETACHED).
    ``pages``: all pages free in order 1..N; needs an empty tree and no open request.
    ``all``: back to the initial state, keeping the clock and node ids monotone.
    """
    scope = event.scope
    if scope in ("rows", "all"):
        state = req_free(state, ReqFree(tuple(state.requests.keys())))
        state = state.with_changes(
            free_rows=FreeQueue.from_pages(range(state.geometry.num_rows, 0, -1))
        )
    if scope in ("tree", "all"):
        state = _reset_tree(state)
    if scope in ("pages", "all"):
        if len(state.nodes) > 1:
            raise Reject("reset the tree before the pages: tree nodes still hold pages")
        if len(state.requests) > 0:
            raise Reject("reset the rows before the pages: requests are still open")
        state = state.with_changes(
            free_pages=FreeQueue.from_pages(range(1, state.geometry.num_pages + 1)),
            holders=Map(),
        )
    return state


def _reset_tree(state: State) -> State:
    if state.tree_refs:
        page = min(state.tree_refs.keys())
        raise Reject(f"tree page {page} is still mapped by a request that does not hold it; "
                     "close or truncate those requests before resetting the tree")
    root = state.root
    freed = sorted(p for p in state.page_node.keys() if p not in state.holders)
    new_root = Node(parent=-1, key=(), pages=(), children=Map(), lock_ref=1,
                    last_access=root.last_access)
    return state.with_changes(
        nodes=Map({ROOT: new_root}),
        page_node=Map(),
        free_pages=state.free_pages.push_tail(freed),
        evictable_size=0,
        protected_size=0,
        leaves=Map(),
    )
