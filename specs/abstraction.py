"""The refinement mapping: ``abstract(kvstate.State) -> specs.model.ModelState``.

It forgets what the model derives (children indexes, ``page_node``, the
evictable/protected counters, ``seq``) and keeps everything that decides
future behaviour.  Holders become sets (their order never matters); the free
list and the free-row stack keep their order (it decides reuse).  Read-only.
"""

from __future__ import annotations

from kvstate.state import State
from specs.model import MNode, ModelState, MRequest


def abstract(state: State) -> ModelState:
    geometry = state.geometry
    return ModelState(
        num_pages=geometry.num_pages,
        page_size=geometry.page_size,
        num_rows=geometry.num_rows,
        row_width=geometry.row_width,
        clock=state.clock,
        next_node=state.next_node_id,
        free=list(state.free_pages),
        holders={page: set(held) for page, held in state.holders.items()},
        free_rows=list(state.free_rows),
        generation=dict(state.row_generation.items()),
        requests={rid: MRequest(list(r.pages), r.allocated, r.committed)
                  for rid, r in state.requests.items()},
        nodes={nid: MNode(n.parent, tuple(n.key), list(n.pages), n.lock_ref, n.last_access)
               for nid, n in state.nodes.items()},
    )


def model_of_geometry(state: State) -> ModelState:
    """The model's initial state for ``state``'s geometry."""
    from specs.model import initial_model

    g = state.geometry
    return initial_model(g.num_pages, g.page_size, g.num_rows, g.row_width)


def diff(a: ModelState, b: ModelState) -> list[str]:
    """Field names where two model states differ (for readable failures)."""
    return [name for name in a.__dataclass_fields__ if getattr(a, name) != getattr(b, name)]
