"""Named invariants of the Mamba state pool (checked when a state has one: ``State.mamba``).

Each recomputed from scratch, pure and read-only, over a frozen or a live
state, with its own registry (``MAMBA_CHECKS``): ``kvstate.invariants.check``
runs them after the core checks on a state with a Mamba pool.

* ``mamba_owned_once``: every slot 1..N is free, held (by a row or DETACHED)
  or one node's state: exactly one of them, once;
* ``mamba_rows``: a row's entries are exactly the slots held by that row, the
  row is open, and it has at least one entry;
* ``mamba_node_states``: the per-node records name live non-root nodes, the
  slot -> node index matches them, and a record with no state carries a lock
  (an empty record is dropped);
* ``mamba_full_covers_lock``: a node's Mamba locks never exceed its FULL locks;
* ``mamba_hit_has_state``: a Mamba-locked node (a hit some request resumes
  from) holds a state: a hit never reaches past the last valid state;
* ``mamba_lru_total``: the states' LRU stamps are distinct, positive and not
  after the clock (so they order the Mamba LRU totally, as SGLang's list);
* ``mamba_sizes``: the evictable / protected counters match the tree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from kvstate.state import DETACHED, ROOT

Check = Callable[[Any], Iterator[str]]
MAMBA_CHECKS: dict[str, Check] = {}


def _named(name: str) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        MAMBA_CHECKS[name] = fn
        return fn

    return register


@_named("mamba_owned_once")
def _owned_once(state: Any) -> Iterator[str]:
    tier = state.mamba
    free = list(tier.free_slots)
    if len(free) != len(set(free)):
        yield "the Mamba free list has a duplicate slot"
    owners: dict[int, list[str]] = {}
    for slot in free:
        owners.setdefault(slot, []).append("free")
    for slot, holder in tier.held.items():
        owners.setdefault(slot, []).append(f"held by {holder!r}")
    for node_id, component in tier.nodes.items():
        if component.slot:
            owners.setdefault(component.slot, []).append(f"node {node_id}")
    for slot, where in sorted(owners.items()):
        if not 1 <= slot <= tier.num_slots:
            yield f"Mamba slot {slot} ({where[0]}) is outside 1..{tier.num_slots}"
        if len(where) > 1:
            yield f"Mamba slot {slot} is owned more than once: {', '.join(where)}"
    missing = [slot for slot in range(1, tier.num_slots + 1) if slot not in owners]
    if missing:
        yield f"Mamba slots {missing[:8]} are neither free, held nor a state (leaked)"


@_named("mamba_rows")
def _rows(state: Any) -> Iterator[str]:
    tier = state.mamba
    for row, entries in tier.rows.items():
        yield from row_problems(state, row, entries)
    for slot, holder in tier.held.items():
        if holder != DETACHED and slot not in tier.rows.get(holder, ()):
            yield f"Mamba slot {slot} is held by row {holder!r}, which does not list it"


def row_problems(state: Any, row: Any, entries: tuple[int, ...]) -> Iterator[str]:
    """What is wrong with one row's Mamba record (the incremental checks too)."""
    tier = state.mamba
    if row not in state.requests:
        yield f"closed row {row!r} still holds Mamba slots {list(entries)}"
    live = [slot for slot in entries if slot]
    if not live:
        yield f"row {row!r} keeps an empty Mamba record"
    if len(set(live)) != len(live):
        yield f"row {row!r} lists a Mamba slot twice: {list(entries)}"
    for slot in live:
        if tier.held.get(slot) != row:
            yield f"row {row!r} lists Mamba slot {slot}, held by {tier.held.get(slot)!r}"


@_named("mamba_node_states")
def _node_states(state: Any) -> Iterator[str]:
    tier = state.mamba
    for node_id, component in tier.nodes.items():
        yield from node_problems(state, node_id, component, "mamba_node_states")
    for slot, node_id in tier.slot_node.items():
        component = tier.nodes.get(node_id)
        if component is None or component.slot != slot:
            yield f"the slot index says Mamba slot {slot} is node {node_id}'s state; it is not"


@_named("mamba_full_covers_lock")
def _full_covers_lock(state: Any) -> Iterator[str]:
    for node_id, component in state.mamba.nodes.items():
        yield from node_problems(state, node_id, component, "mamba_full_covers_lock")


@_named("mamba_hit_has_state")
def _hit_has_state(state: Any) -> Iterator[str]:
    for node_id, component in state.mamba.nodes.items():
        yield from node_problems(state, node_id, component, "mamba_hit_has_state")


def node_problems(state: Any, node_id: int, component: Any, name: str) -> Iterator[str]:
    """One check's findings on one node's Mamba record (the incremental checks too)."""
    node = state.nodes.get(node_id)
    if name == "mamba_node_states":
        if node is None or node_id == ROOT:
            yield f"a Mamba record names {'the root' if node is not None else 'gone'} node {node_id}"
        elif not component.slot and (component.stamp or not component.lock_ref):
            yield f"node {node_id} keeps a Mamba record with no state ({tuple(component)})"
        elif component.slot and state.mamba.slot_node.get(component.slot) != node_id:
            yield f"node {node_id}'s Mamba state {component.slot} is missing from the slot index"
    elif name == "mamba_full_covers_lock":
        full = 0 if node is None else node.lock_ref
        if component.lock_ref < 0 or component.lock_ref > full:
            yield (f"node {node_id} has {component.lock_ref} Mamba locks over {full} FULL "
                   "locks")
    elif name == "mamba_hit_has_state":
        if component.lock_ref and not component.slot:
            yield (f"node {node_id} is a locked hit ({component.lock_ref} Mamba locks) with no "
                   "Mamba state: the hit reaches past the last valid state")


@_named("mamba_lru_total")
def _lru_total(state: Any) -> Iterator[str]:
    seen: dict[int, int] = {}
    for node_id, component in state.mamba.nodes.items():
        if not component.slot:
            continue
        stamp = component.stamp
        if stamp <= 0 or stamp > state.clock:
            yield f"node {node_id}'s Mamba LRU stamp {stamp} is outside 1..clock {state.clock}"
        if stamp in seen:
            yield f"nodes {seen[stamp]} and {node_id} share Mamba LRU stamp {stamp}"
        seen[stamp] = node_id


@_named("mamba_sizes")
def _sizes(state: Any) -> Iterator[str]:
    evictable = protected = 0
    for component in state.mamba.nodes.values():
        if component.slot:
            if component.lock_ref:
                protected += 1
            else:
                evictable += 1
    tier = state.mamba
    if (tier.evictable, tier.protected) != (evictable, protected):
        yield (f"Mamba sizes say evictable {tier.evictable} / protected {tier.protected}, the "
               f"tree has {evictable} / {protected}")


def check_mamba(state: Any, names: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    """``(name, message)`` for every violation (nothing without a Mamba pool)."""
    if getattr(state, "mamba", None) is None:
        return []
    names = tuple(MAMBA_CHECKS) if names is None else names
    return [(name, message) for name in names for message in MAMBA_CHECKS[name](state)]
