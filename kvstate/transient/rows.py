"""Transient rules for request rows (mirrors ``kvstate.reducer.rows``).

``Reset`` has no rule here: it is rare and rebuilds whole containers, so it
goes through the pure reducer (see ``TransientApplier``).
"""

from __future__ import annotations

from kvstate.events import ReqAlloc, ReqFree
from kvstate.reducer.common import bump_counts, drop_holds, unheld_tree_pages
from kvstate.transient.state import TransientState, TRequest


def req_alloc(ts: TransientState, event: ReqAlloc) -> bool:
    request_ids = event.requests
    if len(set(request_ids)) != len(request_ids):
        return False
    requests, rows = ts.requests, ts.free_rows.order
    for request_id in request_ids:
        # A free row is always in 1..num_rows, so queue membership covers the range checks.
        if request_id in requests if type(request_id) is str else request_id not in rows:
            return False
    generation = ts.row_generation
    for request_id in request_ids:
        if not isinstance(request_id, str):
            del rows[request_id]
            generation[request_id] = generation.get(request_id, 0) + 1
        requests[request_id] = TRequest([], 0, 0)
    return True


def req_free(ts: TransientState, event: ReqFree) -> bool:
    request_ids = event.requests
    requests = ts.requests
    if len(set(request_ids)) != len(request_ids) or any(r not in requests for r in request_ids):
        return False
    for request_id in request_ids:
        table = requests.pop(request_id).pages
        bump_counts(ts.tree_refs, unheld_tree_pages(ts, request_id, table), -1)
        drop_holds(ts.holders, ts.page_node, request_id, table)
    # Rows go back on top of the stack in the order given: the last one is reused first.
    ts.free_rows.push_head([r for r in reversed(request_ids) if not isinstance(r, str)])
    return True
