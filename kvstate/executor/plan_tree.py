"""Index planning for radix-tree events: ``Insert``, ``Split``, ``Evict``, ``Reset``.

Pure, like :mod:`kvstate.executor.plan`: each planner reads the state the
event applies to and returns an ``IndexPlan``; importing this module
registers them.  ``Touch``, ``Lock`` and ``Unlock`` change no bytes and no
meaning, so they have no planner.

Which bytes move: ``Evict`` frees the pages of its nodes that no request
holds (a request that holds a tree page keeps it); ``Reset`` frees what its
scope releases (see ``kvstate.rules.rows``), SWA pages and Mamba states included
(:func:`kvstate.executor.plan_swa.swa_reset_part`,
:func:`kvstate.executor.plan_mamba.mamba_reset_part`).  With a host tier an evicted
backed-up node is demoted (it stays host-only, its host bytes stay), and a
tree reset drops every host copy.
"""

from __future__ import annotations

from typing import Any

from kvstate.events import Evict, Insert, Reset, Split
from kvstate.executor.index_plan import IndexPlan, depth_below, page_slots, plans
from kvstate.executor.plan_mamba import mamba_reset_part
from kvstate.executor.plan_swa import swa_reset_part
from kvstate.state import ROOT


@plans(Insert)
def _insert(before: Any, event: Insert) -> IndexPlan:
    depth = depth_below(before, event.parent)
    return IndexPlan(inserted=((event.node, depth, tuple(event.slots)),))


@plans(Split)
def _split(before: Any, event: Split) -> IndexPlan:
    return IndexPlan(split=((event.node, event.at, event.new_node),))


@plans(Evict)
def _evict(before: Any, event: Evict) -> IndexPlan:
    holders, nodes = before.holders, before.nodes
    freed = [page for node_id in event.nodes for page in nodes[node_id].pages
             if page not in holders]
    slots = page_slots(freed, before.geometry.page_size)
    host = before.host
    if host is None:
        return IndexPlan(freed_slots=slots, dropped_nodes=event.nodes)
    backup = host.backup
    return IndexPlan(freed_slots=slots,
                     dropped_nodes=tuple(n for n in event.nodes if n not in backup),
                     demoted_nodes=tuple(n for n in event.nodes if n in backup))


@plans(Reset)
def _reset(before: Any, event: Reset) -> IndexPlan:
    """What each scope releases, read off the state before it (the rule's own order)."""
    scope = event.scope
    holders, page_node = before.holders, before.page_node
    closed: tuple[Any, ...] = ()
    dropped: tuple[int, ...] = ()
    host_freed: list[int] = []
    if scope in ("rows", "all"):
        closed = tuple(before.requests.keys())  # their own pages become DETACHED, not free
    if scope == "tree":
        freed = sorted(page for page in page_node.keys() if page not in holders)
    elif scope == "pages":  # no tree, no request: every held page is DETACHED
        freed = sorted(holders.keys())
    elif scope == "all":
        freed = sorted(set(holders.keys()) | set(page_node.keys()))
    else:
        freed = []
    if scope in ("tree", "all"):
        dropped = tuple(n for n in before.nodes.keys() if n != ROOT)
        host = before.host
        if host is not None:
            dropped += tuple(host.evicted.keys())
            host_freed = [page for pages in host.backup.values() for page in pages]
    size = before.geometry.page_size
    return IndexPlan(freed_slots=page_slots(freed, size), closed=closed, dropped_nodes=dropped,
                     host_freed=page_slots(host_freed, size), **swa_reset_part(before, scope),
                     **mamba_reset_part(before, scope))
