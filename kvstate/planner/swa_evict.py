"""FULL + SWA hybrid eviction (SGLang 0.5.23's ``UnifiedRadixCache._evict_components``).

The components are walked in tree order, FULL then SWA, each toward its own
count of tokens (``evict``) or until its pool has room for an allocation
(``evict_for_alloc``: a target of free + shortfall, checked after every
victim, so a walk stops as soon as collateral frees suffice).

* FULL: unlocked leaves by LRU (oldest ``last_access`` first); a parent
  that loses its last child joins the candidates.  A leaf goes entirely:
  ``SwaEvict`` of its live SWA, then ``Evict``.
* SWA: the SWA LRU from its least recent end, skipping window-locked nodes.
  An unlocked FULL leaf goes entirely (so SWA eviction can free FULL too);
  any other node is tombstoned (``SwaEvict``: it keeps its FULL KV).

Frees go at the tail with page size 1 and at the head with pages (SGLang's
segment frees).  A leaf that a request row still maps is never removed (it
would be a use after free: ``kvstate.planner.evict.is_mapped``).
"""

from __future__ import annotations

import heapq
from typing import Any

import attrs

from kvstate.events import Evict, SwaEvict
from kvstate.planner.builder import Builder
from kvstate.planner.evict import is_mapped
from kvstate.state import ROOT

FULL, SWA = "full", "swa"


@attrs.frozen
class Evicted:
    full: int = 0  # FULL tokens evicted (SGLang's num_tokens_evicted)
    swa: int = 0  # SWA tokens evicted (swa_num_tokens_evicted)


def swa_lru(state: Any) -> list[int]:
    """Live SWA nodes from the least recent to the most recent: by stamp, and among equal
    stamps (one root path) the shallower first."""
    nodes = state.nodes
    depths = {ROOT: 0}
    live = []
    for node_id, node in nodes.items():
        if node.swa is not None and node.swa.live:
            live.append((node.swa.stamp, _depth(nodes, node_id, depths), node_id))
    live.sort()
    return [node_id for _, _, node_id in live]


def _depth(nodes: Any, node_id: int, known: dict[int, int]) -> int:
    """A node's depth, remembering every ancestor's on the way (linear over a tree)."""
    path = []
    while node_id not in known:
        path.append(node_id)
        node_id = nodes[node_id].parent
    depth = known[node_id]
    for step in reversed(path):
        depth += 1
        known[step] = depth
    return depth


def available(state: Any, component: str) -> int:
    """Free tokens of a pool."""
    queue = state.free_pages if component == FULL else state.swa.free_pages
    return len(queue) * state.geometry.page_size


class _Walk:
    """One eviction: the running tallies and the optional availability targets."""

    def __init__(self, b: Builder, targets: dict[str, int] | None, at_head: bool) -> None:
        self.b = b
        self.targets = targets
        self.at_head = at_head
        self.tally = {FULL: 0, SWA: 0}

    def reached(self, component: str) -> bool:
        if self.targets is None or component not in self.targets:
            return False
        return available(self.b.state, component) >= self.targets[component]

    def remove(self, node_id: int) -> None:
        """Delete an unlocked leaf with every component."""
        node = self.b.state.nodes[node_id]
        if node.swa.live:
            self.b.emit(SwaEvict((node_id,), self.at_head))
            self.tally[SWA] += len(node.key)
        self.b.emit(Evict((node_id,), self.at_head))
        self.tally[FULL] += len(node.key)

    def tombstone(self, node_id: int) -> None:
        node = self.b.state.nodes[node_id]
        self.b.emit(SwaEvict((node_id,), self.at_head))
        self.tally[SWA] += len(node.key)

    def removable(self, node_id: int) -> bool:
        """An unlocked leaf that no row maps (SGLang's D-leaf)."""
        state = self.b.state
        return node_id in state.leaves and not is_mapped(state, node_id)


def plan_unified_evict(b: Builder, full_tokens: int, swa_tokens: int, *, at_head: bool,
                       targets: dict[str, int] | None = None) -> Evicted:
    """Evict toward ``full_tokens`` / ``swa_tokens`` (or the availability ``targets``)."""
    walk = _Walk(b, targets, at_head)
    requests = {FULL: full_tokens, SWA: swa_tokens}
    for component in (FULL, SWA):
        request = requests[component]
        to_target = component == FULL and request > 0 and targets is not None and FULL in targets
        if walk.reached(component) or (not to_target and walk.tally[component] >= request):
            continue
        quota = request
        if to_target:
            quota = max(request, walk.tally[FULL] + b.state.evictable_size)
        if component == FULL:
            full_walk(walk, quota)
        else:
            _swa_walk(walk, quota)
    return Evicted(walk.tally[FULL], walk.tally[SWA])


def plan_evict_for_alloc(b: Builder, full_shortfall: int, swa_shortfall: int, *,
                         at_head: bool) -> Evicted:
    """SGLang's ``evict_for_alloc``: the counts are shortfalls, turned into targets of
    free + shortfall per pool."""
    state = b.state
    targets = {}
    if full_shortfall > 0:
        targets[FULL] = available(state, FULL) + full_shortfall
    if swa_shortfall > 0:
        targets[SWA] = available(state, SWA) + swa_shortfall
    return plan_unified_evict(b, full_shortfall, swa_shortfall, at_head=at_head, targets=targets)


def full_walk(walk: Any, quota: int) -> None:
    """FULL eviction: unlocked leaves by LRU, a parent joining the heap once it becomes a
    leaf, until ``quota`` FULL tokens are out.  ``walk`` is this module's or the Mamba
    planner's walk (``b``, ``tally``, ``removable``, ``remove``, ``reached``)."""
    state = walk.b.state
    heap = [(state.nodes[n].last_access, n) for n in state.leaves]
    heapq.heapify(heap)
    while walk.tally[FULL] < quota and heap:
        _, node_id = heapq.heappop(heap)
        if not walk.removable(node_id):
            continue
        parent = walk.b.state.nodes[node_id].parent
        walk.remove(node_id)
        if walk.reached(FULL):
            return
        if parent != ROOT and parent in walk.b.state.leaves:
            heapq.heappush(heap, (walk.b.state.nodes[parent].last_access, parent))


def _swa_walk(walk: _Walk, quota: int) -> None:
    order = swa_lru(walk.b.state)
    index = 0
    while walk.tally[SWA] < quota:
        nodes = walk.b.state.nodes
        while index < len(order) and (order[index] not in nodes or not nodes[order[index]].swa.live
                                      or nodes[order[index]].swa.lock_ref):
            index += 1
        if index == len(order):
            return
        node_id = order[index]
        index += 1
        if walk.removable(node_id):
            walk.remove(node_id)
        else:
            walk.tombstone(node_id)
        if walk.reached(SWA):
            return
