"""Eviction planning: which unlocked leaves go, in what order.

The default priority is SGLang's LRU: oldest ``last_access`` first, ties
broken by the older node (smaller id).  A parent that loses its last child
and is unlocked becomes a candidate in the same pass with its own (older)
time.  Whole nodes are evicted, so a plan may overshoot ``num_tokens``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any

from kvstate.events import Evict
from kvstate.planner.builder import Builder
from kvstate.state import ROOT

Priority = Callable[[Any, int], Any]
Victims = Callable[[Any, int], Sequence[int]]
"""A policy's choice: node ids to evict, in order, for ``num_tokens`` tokens (``planner.policy``)."""


def lru_priority(state: Any, node_id: int) -> tuple[int, int]:
    return (state.nodes[node_id].last_access, node_id)


def fifo_priority(state: Any, node_id: int) -> tuple[int, int]:
    return (node_id, node_id)  # node ids are handed out in creation order


def is_mapped(state: Any, node_id: int) -> bool:
    """Whether a request maps one of the node's pages without holding it (never evict it)."""
    tree_refs = state.tree_refs
    return bool(tree_refs) and any(map(tree_refs.__contains__, state.nodes[node_id].pages))


def candidate_leaves(state: Any) -> list[int]:
    """Unlocked childless nodes below the root (some may still be mapped: see ``is_mapped``)."""
    if state.geometry.mode == "radix":
        return list(state.leaves.keys())
    return [
        node_id
        for node_id, node in state.nodes.items()
        if node_id != ROOT and node.lock_ref == 0 and len(node.children) == 0
    ]


def eviction_order(state: Any, num_tokens: int, priority: Priority = lru_priority) -> list[int]:
    """Node ids to evict, in order, until at least ``num_tokens`` are covered (or none remain)."""
    heap = [(priority(state, n), n) for n in candidate_leaves(state)]
    heapq.heapify(heap)
    remaining_children: dict[int, int] = {}
    order: list[int] = []
    evicted = 0
    nodes = state.nodes
    while evicted < num_tokens and heap:
        _, node_id = heapq.heappop(heap)
        if is_mapped(state, node_id):  # checked only for the nodes actually reached
            continue
        node = nodes[node_id]
        order.append(node_id)
        evicted += len(node.key)
        parent_id = node.parent
        if parent_id == ROOT:
            continue
        left = remaining_children.get(parent_id, len(nodes[parent_id].children)) - 1
        remaining_children[parent_id] = left
        if left == 0 and nodes[parent_id].lock_ref == 0:
            heapq.heappush(heap, (priority(state, parent_id), parent_id))
    return order


def freed_pages(state: Any, order: list[int]) -> int:
    """How many pages evicting ``order`` returns to the free list (pages no one else holds)."""
    nodes, holders = state.nodes, state.holders
    return sum(1 for node_id in order for page in nodes[node_id].pages if page not in holders)


def plan_evict(b: Builder, num_tokens: int, *, at_head: bool,
               priority: Priority = lru_priority) -> int:
    """Evict at least ``num_tokens`` tokens if possible; the tokens evicted.  Emits ``Evict``."""
    order = eviction_order(b.state, num_tokens, priority) if num_tokens > 0 else []
    return plan_evict_nodes(b, order, at_head=at_head)


def plan_evict_nodes(b: Builder, nodes: Sequence[int], *, at_head: bool) -> int:
    """Evict exactly ``nodes``, in order (a policy's victims); the tokens evicted.

    Emits one ``Evict`` (nothing for no nodes); the rules refuse a node that
    is not evictable when its turn comes.
    """
    if not nodes:
        return 0
    state = b.state
    evicted = sum(len(state.nodes[n].key) for n in nodes if n in state.nodes)
    b.emit(Evict(tuple(nodes), at_head))
    return evicted
