"""Read-only derivations for ``stats()`` and ``memory_efficiency()``.  Pure.

Everything is computed from the core state on each call (no counters kept
in the manager).  Each function takes a frozen ``State`` or the engine's live
view (the manager passes ``engine.view``: no freeze on the read path).

* active requests: the anchors ``req/<id>``;
* cached tokens: a token counts once, when its layer-0 entry exists, i.e.
  the sum of every active request's layer-0 ``committed`` length (a request
  that reuses a prefix counts the prefix's tokens as its own);
* used pages: every page that is not free (reservations in basic mode;
  request pages plus retained prefix pages in paged mode).

Efficiency counts (token, layer) entries over (token, layer) slots, i.e.
over *all* layers, and physically (a shared page counts once):

* basic: stored entries / (reserved tokens * num_layers);
* paged: for each non-free page, the offsets that hold a stored entry of
  some table mapping it (position < that table's ``committed``) or of the
  prefix node holding it (position < prefix_tokens), over
  ``allocated_pages * page_size``.  0.0 when nothing is allocated.
"""

from __future__ import annotations

from typing import Any

from kvstate.planner.kv_layout import (
    layer_name,
    layer_pages,
    parse_layer_name,
    prefix_tokens_of,
    seed_id,
)
from kvstate.state import ROOT


def active_request_ids(state: Any) -> list[str]:
    """Seed ids of the active requests (anchor order of the state's map)."""
    return [name for name in (seed_id(r) for r in state.requests.keys()) if name is not None]


def cached_tokens(state: Any) -> int:
    requests = state.requests
    return sum(requests[layer_name(request_id, 0)].committed
               for request_id in active_request_ids(state))


def used_pages(state: Any) -> int:
    """Pages not on the free list (a zero-capacity geometry's lone page stays free)."""
    return state.geometry.num_pages - len(state.free_pages)


def seed_stats(state: Any, sized: bool, bytes_per_page: int, total: int) -> dict[str, int | float]:
    """``stats()``: the seed's five keys, in its order (``sized``: the mode is chosen)."""
    used = used_pages(state) * bytes_per_page if sized else 0
    return {
        "total_memory_bytes": total,
        "used_memory_bytes": used,
        "num_active_requests": len(active_request_ids(state)),
        "total_cached_tokens": cached_tokens(state),
        "utilization_pct": used / total * 100.0 if total else 0.0,
    }


def basic_efficiency(state: Any, num_layers: int) -> float:
    stored = reserved = 0
    for core_id, record in state.requests.items():
        if seed_id(core_id) is not None:
            reserved += record.allocated * num_layers
        elif parse_layer_name(core_id) is not None:
            stored += record.committed
    return stored / reserved if reserved else 0.0


def paged_efficiency(state: Any, num_layers: int) -> float:
    size = state.geometry.page_size
    allocated = used_pages(state)
    if allocated == 0:
        return 0.0
    filled: dict[int, int] = {}
    for core_id, record in state.requests.items():
        if parse_layer_name(core_id) is None:
            continue
        for index, page in enumerate(record.pages):
            count = min(max(record.committed - index * size, 0), size)
            if count > filled.get(page, 0):
                filled[page] = count
    for node_id, node in state.nodes.items():
        if node_id == ROOT:
            continue
        tokens = prefix_tokens_of(node)
        for layer in range(num_layers):
            for index, page in enumerate(layer_pages(node, num_layers, layer)):
                count = min(max(tokens - index * size, 0), size)
                if count > filled.get(page, 0):
                    filled[page] = count
    return sum(filled.values()) / (allocated * size)
