"""FULL + MAMBA (and FULL + SWA + MAMBA) hybrid eviction (SGLang 0.5.23's
``UnifiedRadixCache._evict_components`` with a ``MambaComponent``).

The components are walked in tree order, FULL, then SWA (when there is an
SWA pool), then MAMBA, each toward its own count (``evict``: tokens for FULL
and SWA, states for MAMBA) or until its pool has room (``evict_for_alloc``:
a target of free + shortfall, checked after every victim).

* FULL: unlocked leaves by LRU (oldest ``last_access`` first), a parent that
  loses its last child joining the candidates.
* SWA: the SWA LRU from its least recent end, skipping window-locked nodes.
* MAMBA: the Mamba LRU from its least recent end, skipping locked states.

Whatever the walk, an unlocked leaf (SGLang's D-leaf) goes entirely, every
component with it (``SwaEvict``, ``MambaEvict``, then ``Evict``), so an SWA
or a Mamba walk can free FULL KV and a FULL walk frees states.  An internal
victim of the SWA walk is tombstoned and cascades to its Mamba state (SWA
outranks Mamba on an internal node); one of the Mamba walk loses its state
only.  FULL frees go at the tail with page size 1 and at the head with
pages; Mamba slots always go to the tail.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvstate.events import Evict, MambaEvict, SwaEvict
from kvstate.planner.builder import Builder
from kvstate.planner.evict import is_mapped
from kvstate.planner.mamba_match import state_of
from kvstate.planner.swa_evict import available as available_tokens
from kvstate.planner.swa_evict import full_walk, swa_lru

FULL, SWA, MAMBA = "full", "swa", "mamba"


@attrs.frozen
class MambaEvicted:
    full: int = 0  # FULL tokens evicted (SGLang's num_tokens_evicted)
    swa: int = 0  # SWA tokens evicted (swa_num_tokens_evicted)
    mamba: int = 0  # Mamba states evicted (mamba_num_evicted)


def mamba_lru(state: Any) -> list[int]:
    """Nodes holding a Mamba state, least recently used first."""
    return [node for _, node in sorted((c.stamp, n) for n, c in state.mamba.nodes.items()
                                       if c.slot)]


def available(state: Any, component: str) -> int:
    """Free room of a pool: tokens for FULL and SWA, slots for MAMBA."""
    if component == MAMBA:
        return len(state.mamba.free_slots)
    return available_tokens(state, component)


class _Walk:
    """One eviction: the running tallies and the optional availability targets."""

    def __init__(self, b: Builder, targets: dict[str, int] | None, at_head: bool) -> None:
        self.b = b
        self.targets = targets
        self.at_head = at_head
        self.tally = {FULL: 0, SWA: 0, MAMBA: 0}

    def reached(self, component: str) -> bool:
        if self.targets is None or component not in self.targets:
            return False
        return available(self.b.state, component) >= self.targets[component]

    def removable(self, node_id: int) -> bool:
        """An unlocked leaf that no row maps (SGLang's D-leaf)."""
        state = self.b.state
        return node_id in state.leaves and not is_mapped(state, node_id)

    def remove(self, node_id: int) -> None:
        """Delete an unlocked leaf with every component."""
        node = self.b.state.nodes[node_id]
        if node.swa is not None and node.swa.live:
            self.b.emit(SwaEvict((node_id,), self.at_head))
            self.tally[SWA] += len(node.key)
        if state_of(self.b.state, node_id):
            self.b.emit(MambaEvict((node_id,)))
            self.tally[MAMBA] += 1
        self.b.emit(Evict((node_id,), self.at_head))
        self.tally[FULL] += len(node.key)

    def drop_swa(self, node_id: int) -> None:
        """Tombstone an internal node's SWA and, cascading, its Mamba state."""
        self.b.emit(SwaEvict((node_id,), self.at_head))
        self.tally[SWA] += len(self.b.state.nodes[node_id].key)
        if state_of(self.b.state, node_id):
            self.drop_state(node_id)

    def drop_state(self, node_id: int) -> None:
        self.b.emit(MambaEvict((node_id,)))
        self.tally[MAMBA] += 1


def components(state: Any) -> tuple[str, ...]:
    return (FULL, SWA, MAMBA) if state.swa is not None else (FULL, MAMBA)


def plan_mamba_evict(b: Builder, full_tokens: int, swa_tokens: int, states: int, *,
                     at_head: bool, targets: dict[str, int] | None = None) -> MambaEvicted:
    """Evict toward the three counts (or the availability ``targets``)."""
    walk = _Walk(b, targets, at_head)
    requests = {FULL: full_tokens, SWA: swa_tokens, MAMBA: states}
    for component in components(b.state):
        request = requests[component]
        to_target = component == FULL and request > 0 and targets is not None and FULL in targets
        if walk.reached(component) or (not to_target and walk.tally[component] >= request):
            continue
        quota = request
        if to_target:
            quota = max(request, walk.tally[FULL] + b.state.evictable_size)
        if component == FULL:
            full_walk(walk, quota)
        elif component == SWA:
            _swa_walk(walk, quota)
        else:
            _mamba_walk(walk, quota)
    return MambaEvicted(walk.tally[FULL], walk.tally[SWA], walk.tally[MAMBA])


def plan_mamba_evict_for_alloc(b: Builder, full_shortfall: int, swa_shortfall: int,
                               state_shortfall: int, *, at_head: bool) -> MambaEvicted:
    """SGLang's ``evict_for_alloc``: the counts are shortfalls, turned into targets of free
    + shortfall per pool (static pools: no FULL donor for Mamba)."""
    state = b.state
    targets = {component: available(state, component) + shortfall
               for component, shortfall in ((FULL, full_shortfall), (SWA, swa_shortfall),
                                            (MAMBA, state_shortfall))
               if shortfall > 0 and component in components(state)}
    return plan_mamba_evict(b, full_shortfall, swa_shortfall, state_shortfall,
                            at_head=at_head, targets=targets)


def _swa_walk(walk: _Walk, quota: int) -> None:
    for node_id in swa_lru(walk.b.state):
        if walk.tally[SWA] >= quota:
            return
        node = walk.b.state.nodes.get(node_id)
        if node is None or not node.swa.live or node.swa.lock_ref:
            continue
        if walk.removable(node_id):
            walk.remove(node_id)
        else:
            walk.drop_swa(node_id)
        if walk.reached(SWA):
            return


def _mamba_walk(walk: _Walk, quota: int) -> None:
    for node_id in mamba_lru(walk.b.state):
        if walk.tally[MAMBA] >= quota:
            return
        component = walk.b.state.mamba.nodes.get(node_id)
        if component is None or not component.slot or component.lock_ref:
            continue
        if walk.removable(node_id):
            walk.remove(node_id)
        else:
            walk.drop_state(node_id)
        if walk.reached(MAMBA):
            return
