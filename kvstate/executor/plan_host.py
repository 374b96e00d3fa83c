"""Index planning across the host tier: ``plan_tiered_indices(before, after, event)``.

Pure (no torch): reads two ``TieredState`` values and an event, returns an
``IndexPlan`` whose ``host_*`` fields say which device and host slots to
copy.  Core events get the core plan, adjusted where the host tier changes
their meaning (an evicted backed-up node is demoted, not dropped; a tree
reset drops every host copy).
"""

from __future__ import annotations

import attrs

from kvstate.events import Event, Evict, Reset
from kvstate.events_host import HostFree, Load, Offload
from kvstate.executor.plan import IndexPlan, page_slots, plan_indices
from kvstate.state_host import TieredState


def plan_tiered_indices(before: TieredState, after: TieredState, event: Event) -> IndexPlan:
    size = before.core.geometry.page_size
    host = before.host
    if isinstance(event, Offload):
        return IndexPlan(host_out_src=page_slots(before.core.nodes[event.node].pages, size),
                         host_out_dst=page_slots(event.host_pages, size))
    if isinstance(event, Load):
        return IndexPlan(host_in_src=page_slots(host.backup[event.node], size),
                         host_in_dst=page_slots(event.pages, size), loaded_nodes=(event.node,))
    if isinstance(event, HostFree):
        pages = [page for node in event.nodes for page in host.backup[node]]
        dropped = tuple(node for node in event.nodes if node in host.evicted)
        return IndexPlan(host_freed=page_slots(pages, size), dropped_nodes=dropped)
    plan = plan_indices(before.core, after.core, event)
    if isinstance(event, Evict):
        demoted = tuple(node for node in event.nodes if node in host.backup)
        kept = tuple(node for node in plan.dropped_nodes if node not in host.backup)
        return attrs.evolve(plan, dropped_nodes=kept, demoted_nodes=demoted)
    if isinstance(event, Reset) and event.scope in ("tree", "all"):
        pages = [page for pages in host.backup.values() for page in pages]
        return attrs.evolve(plan, host_freed=page_slots(pages, size),
                            dropped_nodes=plan.dropped_nodes + tuple(host.evicted.keys()))
    return plan
