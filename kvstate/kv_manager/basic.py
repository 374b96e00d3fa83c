"""Basic-mode planning: contiguous worst-case reservations (seed 002, Part 1).

Pure: ``(state, call) -> Plan``; nothing here mutates or imports torch.

Geometry: ``page_size == 1`` and one core page is one token's K and V for
*all* layers (``ModelConfig.bytes_per_token`` bytes), so the page count is
exactly ``max_gpu_memory_bytes // bytes_per_token`` and a reservation of N
tokens is exactly N pages.  Core requests of one seed request (see
:mod:`kvstate.kv_manager.names`)::

    req/<id>       holds the N reserved pages (Allocate with an item)
    L<l>/<id>      layer l's stored tokens: append k shares reserved page k
                   into this table (Share) and commits it (Append)

So "tokens stored in layer l" is the layer table's ``committed`` length and
"reserved" is the anchor's ``allocated`` length: both live in the core.
"""

from __future__ import annotations

from kvstate.events import Allocate, Append, Free, ReqAlloc, ReqFree, Share
from kvstate.kv_manager.errors import ReservationExceeded
from kvstate.kv_manager.names import anchor_name, core_names, layer_name
from kvstate.planner.builder import Plan, PlanBuilder
from kvstate.state import DETACHED, State


def usable_free_pages(state: State, phantom_pages: int) -> int:
    """Free pages a plan may take (``phantom_pages`` pad a zero-capacity geometry)."""
    return len(state.free_pages) - phantom_pages


def plan_reserve(state: State, request_id: str, num_layers: int, tokens: int,
                 phantom_pages: int) -> Plan[bool] | None:
    """Open the request and reserve ``tokens`` pages; ``None`` if they are not free."""
    if tokens > usable_free_pages(state, phantom_pages):
        return None
    builder = PlanBuilder(state)
    builder.emit(ReqAlloc(core_names(request_id, num_layers)))
    pages = tuple(state.free_pages.head(tokens))
    builder.emit(Allocate(pages, ((anchor_name(request_id), pages),)))
    return builder.done(True)


def plan_append(state: State, request_id: str, layer: int) -> Plan[int]:
    """Store the next token of ``layer``: the result is its slot (= page).

    Raises ``ReservationExceeded`` (no events) when the layer already holds
    every reserved token.
    """
    anchor = state.requests[anchor_name(request_id)]
    table = layer_name(request_id, layer)
    position = state.requests[table].allocated
    if position >= anchor.allocated:
        raise ReservationExceeded(request_id, layer, anchor.allocated)
    slot = anchor.pages[position]
    builder = PlanBuilder(state)
    builder.emit(Share(table, position, (slot,)))
    builder.emit(Append(((table, position + 1),)))
    return builder.done(slot)


def plan_release(state: State, request_id: str, num_layers: int) -> Plan[None]:
    """Close every core request of the seed request and free its reservation.

    Freed pages go to the head of the free list in reservation order, so
    the next reservation reuses them first.
    """
    pages = list(state.requests[anchor_name(request_id)].pages)
    builder = PlanBuilder(state)
    builder.emit(ReqFree(core_names(request_id, num_layers)))
    holders = builder.state.holders
    detached = tuple(page for page in pages if holders.get(page) == (DETACHED,))
    if detached:
        builder.emit(Free(detached, at_head=True))
    return builder.done(None)
