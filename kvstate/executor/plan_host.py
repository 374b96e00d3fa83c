"""Index planning for host-tier events: ``Offload``, ``Load``, ``HostFree``.

Pure: reads the state the event applies to (its ``host`` tier) and returns
an ``IndexPlan`` whose ``host_*`` fields say which device and host slots to
copy.  Importing this module registers the planners.  How core events
follow the tier (an evicted backed-up node is demoted, a tree reset drops
every host copy) is planned with those events, in :mod:`kvstate.executor.plan_tree`.

Which bytes move: ``Offload`` copies a device node's pages to its new host
pages (the device copy stays); ``Load`` copies a host-only node's host pages
onto fresh device pages; ``HostFree`` frees host pages (host bytes become
garbage; nothing is copied).
"""

from __future__ import annotations

from typing import Any

from kvstate.events import HostFree, Load, Offload
from kvstate.executor.index_plan import IndexPlan, page_slots, plans


@plans(Offload)
def _offload(before: Any, event: Offload) -> IndexPlan:
    size = before.geometry.page_size
    return IndexPlan(host_out_src=page_slots(before.nodes[event.node].pages, size),
                     host_out_dst=page_slots(event.host_pages, size))


@plans(Load)
def _load(before: Any, event: Load) -> IndexPlan:
    size = before.geometry.page_size
    device = page_slots(event.pages, size)
    return IndexPlan(host_in_src=page_slots(before.host.backup[event.node], size),
                     host_in_dst=device, loaded_nodes=((event.node, device),))


@plans(HostFree)
def _host_free(before: Any, event: HostFree) -> IndexPlan:
    host = before.host
    pages = [page for node in event.nodes for page in host.backup[node]]
    dropped = tuple(node for node in event.nodes if node in host.evicted)
    return IndexPlan(host_freed=page_slots(pages, before.geometry.page_size), dropped_nodes=dropped)
