"""Eviction planning: which unlocked leaves go, in what order.

The default priority is SGLang's LRU: oldest ``last_access`` first, ties
broken by the older node (smaller id).  A parent that loses its last child
and is unlocked becomes a candidate in the same pass with its own (older)
time.  Whole nodes are evicted, so the plan may overshoot ``num_tokens``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any

from kvstate.events import Evict
from kvstate.planner.builder import Plan, PlanBuilder
from kvstate.state import ROOT, State

Priority = Callable[[State, int], Any]
Victims = Callable[[State, int], Sequence[int]]
"""A policy's choice: node ids to evict, in order, for ``num_tokens`` tokens (``planner.policy``)."""


def lru_priority(state: State, node_id: int) -> tuple[int, int]:
    return (state.nodes[node_id].last_access, node_id)


def fifo_priority(state: State, node_id: int) -> tuple[int, int]:
    return (node_id, node_id)  # node ids are handed out in creation order


def _mapped_nodes(state: State) -> set[int]:
    """Tree nodes whose pages a request maps without holding them (an unlocked prefix: never evict).

    ``tree_refs`` only counts tree pages, so each names its node through ``page_node``.
    """
    tree_refs = state.tree_refs
    if not tree_refs:
        return set()
    page_node = state.page_node
    return {page_node[page] for page in tree_refs.keys() if page in page_node}


def evictable_leaves(state: State, mapped: set[int] | None = None) -> list[int]:
    """Unlocked childless nodes below the root that no request still maps.

    ``mapped`` is ``_mapped_nodes(state)`` when the caller has it already.
    """
    if state.geometry.mode == "radix":
        if mapped is None:
            mapped = _mapped_nodes(state)
        if not mapped:
            return list(state.leaves.keys())
        return [n for n in state.leaves.keys() if n not in mapped]
    return [
        node_id
        for node_id, node in state.nodes.items()
        if node_id != ROOT and node.lock_ref == 0 and len(node.children) == 0
    ]


def eviction_order(state: State, num_tokens: int, priority: Priority = lru_priority) -> list[int]:
    """Node ids to evict, in order, until at least ``num_tokens`` are covered (or none remain)."""
    mapped = _mapped_nodes(state)
    heap = [(priority(state, n), n) for n in evictable_leaves(state, mapped)]
    heapq.heapify(heap)
    remaining_children: dict[int, int] = {}
    order: list[int] = []
    evicted = 0
    nodes = state.nodes
    while evicted < num_tokens and heap:
        _, node_id = heapq.heappop(heap)
        node = nodes[node_id]
        order.append(node_id)
        evicted += len(node.key)
        parent_id = node.parent
        if parent_id == ROOT:
            continue
        left = remaining_children.get(parent_id, len(nodes[parent_id].children)) - 1
        remaining_children[parent_id] = left
        if left == 0 and nodes[parent_id].lock_ref == 0 and parent_id not in mapped:
            heapq.heappush(heap, (priority(state, parent_id), parent_id))
    return order


def plan_evict(
    state: State, num_tokens: int, *, at_head: bool, priority: Priority = lru_priority
) -> Plan[int]:
    """Evict at least ``num_tokens`` tokens if possible; the result is the tokens evicted."""
    order = eviction_order(state, num_tokens, priority) if num_tokens > 0 else []
    return plan_evict_nodes(state, order, at_head=at_head)


def plan_evict_nodes(state: State, nodes: Sequence[int], *, at_head: bool) -> Plan[int]:
    """Evict exactly ``nodes``, in order (a policy's victims); the result is the tokens evicted.

    The reducer rejects a node that is not evictable when its turn comes.
    """
    builder = PlanBuilder(state)
    if not nodes:
        return builder.done(0)
    builder.emit(Evict(tuple(nodes), at_head))  # first: the reducer vets the nodes
    return builder.done(sum(len(state.nodes[n].key) for n in nodes))
