"""Rules of the Mamba state pool: allocate, bind, free, donate, copy, commit, stamp, lock, evict.

Ownership of a Mamba slot (``State.mamba``)::

    slot 0            the dummy padding slot, never used
    slots 1..N        exactly one of
                        free       in ``mamba.free_slots`` (queue order = reuse order)
                        held       by a request row (one of ``mamba.rows[row]``'s entries)
                                   or DETACHED (between owners)
                        a state    of one tree node (``mamba.nodes[node].slot``)

A node's Mamba lock (``mamba.nodes[node].lock_ref``) never exceeds its FULL
``lock_ref``: a request's FULL lock covers its whole path, its Mamba lock
the one node it resumes from.  Every rule checks all its preconditions
before its first write (``kvstate.rules``).  The FULL rules' Mamba clauses
are in ``kvstate.rules.mamba_clauses``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.events import (
    MambaAlloc,
    MambaBind,
    MambaCommit,
    MambaCopy,
    MambaDonate,
    MambaEvict,
    MambaFree,
    MambaLock,
    MambaTouch,
    MambaUnlock,
)
from kvstate.rules.common import check_distinct, check_time
from kvstate.rules.registry import Reject, rule
from kvstate.state import DETACHED, ROOT, MambaNode

NO_STATE = MambaNode()


def tier_of(s: Any) -> Any:
    tier = s.mamba
    if tier is None:
        raise Reject("this cache has no Mamba pool")
    return tier


def _where(tier: Any, slot: int) -> str:
    """Where a slot that is not held sits (for a refusal)."""
    if not 1 <= slot <= tier.num_slots:
        return f"outside 1..{tier.num_slots}" if slot else "the reserved dummy slot"
    node = tier.slot_node.get(slot)
    return "free" if node is None else f"the state of tree node {node}"


def _check_held(tier: Any, slots: Sequence[int], what: str) -> None:
    held = tier.held
    for slot in slots:
        if slot not in held:
            raise Reject(f"{what} {slot} is not held: it is {_where(tier, slot)}")


def _tree_node(s: Any, node_id: int) -> Any:
    node = s.nodes.get(node_id)
    if node is None:
        raise Reject(f"unknown tree node {node_id}")
    if node_id == ROOT:
        raise Reject("the root has no Mamba component")
    return node


def component_of(tier: Any, node_id: int) -> MambaNode:
    found: MambaNode | None = tier.nodes.get(node_id)
    return NO_STATE if found is None else found


def _setcomponent_of(tier: Any, node_id: int, component: MambaNode) -> None:
    if component.slot or component.lock_ref:
        tier.nodes[node_id] = component
    elif node_id in tier.nodes:
        del tier.nodes[node_id]


def _drop_holds(tier: Any, slots: Sequence[int]) -> list[Any]:
    """Take ``slots`` (held) out of their holders; rows left with no entry go.  Returns the
    rows that changed."""
    held, rows = tier.held, tier.rows
    changed: dict[Any, list[int]] = {}
    for slot in slots:
        holder = held.pop(slot)
        if holder != DETACHED:
            changed.setdefault(holder, []).append(slot)
    for row, gone in changed.items():
        entries = tuple(0 if slot in gone else slot for slot in rows[row])
        if any(entries):
            rows[row] = entries
        else:
            del rows[row]
    return list(changed)


def touch_slots(s: Any, slots: Sequence[int]) -> None:
    if s.touched is not None:
        s.touched.mamba_slots.update(slots)


@rule(MambaAlloc)
def mamba_alloc(s: Any, event: MambaAlloc) -> None:
    tier = tier_of(s)
    if not event.slots:
        raise Reject("a Mamba allocation names no slot")
    check_distinct(event.slots, "Mamba slot")
    queue = tier.free_slots
    taken = queue.missing(event.slots)
    if taken is not None:
        raise Reject(f"Mamba slot {taken} is not free: it is "
                     f"{'held' if taken in tier.held else _where(tier, taken)}")
    tier.free_slots = queue.take(event.slots)
    held = tier.held
    for slot in event.slots:
        held[slot] = DETACHED
    touch_slots(s, event.slots)


@rule(MambaBind)
def mamba_bind(s: Any, event: MambaBind) -> None:
    tier = tier_of(s)
    row, slots = event.row, event.slots
    if row == DETACHED or row not in s.requests:
        raise Reject(f"row {row!r} is not an open request row")
    if row in tier.rows:
        raise Reject(f"row {row!r} already holds Mamba slots {list(tier.rows[row])}")
    if not slots or not slots[0]:
        raise Reject("a bound row needs its running state slot first (nonzero)")
    live = [slot for slot in slots if slot]
    check_distinct(live, "Mamba slot")
    _check_held(tier, live, "Mamba slot")
    for slot in live:
        if tier.held[slot] != DETACHED:
            raise Reject(f"Mamba slot {slot} is held by row {tier.held[slot]!r}, not DETACHED")
    tier.rows[row] = tuple(slots)
    for slot in live:
        tier.held[slot] = row
    touch_slots(s, live)


@rule(MambaFree)
def mamba_free(s: Any, event: MambaFree) -> None:
    tier = tier_of(s)
    if not event.slots:
        raise Reject("a Mamba free names no slot")
    check_distinct(event.slots, "Mamba slot")  # a duplicate inside one free is a double free
    _check_held(tier, event.slots, "Mamba slot")
    _drop_holds(tier, event.slots)
    tier.free_slots = tier.free_slots.push_tail(event.slots)
    touch_slots(s, event.slots)


@rule(MambaDonate)
def mamba_donate(s: Any, event: MambaDonate) -> None:
    tier = tier_of(s)
    entries = tier.rows.get(event.row)
    if entries is None:
        raise Reject(f"row {event.row!r} holds no Mamba slots")
    if not 1 <= event.index < len(entries):
        raise Reject(f"row {event.row!r} has track entries 1..{len(entries) - 1}, "
                     f"not {event.index}")
    old = entries[event.index]
    if not old:
        raise Reject(f"row {event.row!r} track entry {event.index} is empty")
    _check_held(tier, (event.fresh,), "fresh Mamba slot")
    if tier.held[event.fresh] != DETACHED:
        raise Reject(f"fresh Mamba slot {event.fresh} is held by row "
                     f"{tier.held[event.fresh]!r}, not DETACHED")
    tier.rows[event.row] = (*entries[:event.index], event.fresh, *entries[event.index + 1:])
    tier.held[event.fresh] = event.row
    tier.held[old] = DETACHED
    touch_slots(s, (old, event.fresh))


@rule(MambaCopy)
def mamba_copy(s: Any, event: MambaCopy) -> None:
    tier = tier_of(s)
    if event.src == event.dst:
        raise Reject(f"a Mamba copy from slot {event.src} onto itself")
    if event.src not in tier.held and event.src not in tier.slot_node:
        raise Reject(f"Mamba copy source {event.src} holds no state: it is "
                     f"{_where(tier, event.src)}")
    _check_held(tier, (event.dst,), "Mamba copy destination")


@rule(MambaCommit)
def mamba_commit(s: Any, event: MambaCommit) -> None:
    tier = tier_of(s)
    check_time(s, event.time)
    _tree_node(s, event.node)
    component = component_of(tier, event.node)
    if component.slot:
        raise Reject(f"node {event.node} already holds Mamba state {component.slot}")
    _check_held(tier, (event.slot,), "Mamba slot")
    _drop_holds(tier, (event.slot,))
    _setcomponent_of(tier, event.node, MambaNode(event.slot, component.lock_ref, event.time))
    tier.slot_node[event.slot] = event.node
    if component.lock_ref:
        tier.protected += 1
    else:
        tier.evictable += 1
    s.clock = event.time
    touch_slots(s, (event.slot,))
    if s.touched is not None:
        s.touched.nodes.add(event.node)


@rule(MambaTouch)
def mamba_touch(s: Any, event: MambaTouch) -> None:
    tier = tier_of(s)
    check_time(s, event.time)
    _tree_node(s, event.node)
    component = component_of(tier, event.node)
    if not component.slot:
        raise Reject(f"node {event.node} holds no Mamba state (not in the Mamba LRU)")
    tier.nodes[event.node] = MambaNode(component.slot, component.lock_ref, event.time)
    s.clock = event.time
    if s.touched is not None:
        s.touched.nodes.add(event.node)


@rule(MambaLock)
def mamba_lock(s: Any, event: MambaLock) -> None:
    tier = tier_of(s)
    node = _tree_node(s, event.node)
    component = component_of(tier, event.node)
    if not component.slot:
        raise Reject(f"node {event.node} holds no Mamba state: a request locks the state it "
                     "resumes from, and a hit never reaches past the last one")
    if node.lock_ref <= component.lock_ref:
        raise Reject(f"node {event.node}: a Mamba lock needs a FULL lock under it (FULL "
                     f"{node.lock_ref}, Mamba {component.lock_ref}); lock FULL first")
    if not component.lock_ref:
        tier.evictable -= 1
        tier.protected += 1
    tier.nodes[event.node] = MambaNode(component.slot, component.lock_ref + 1,
                                       component.stamp)
    if s.touched is not None:
        s.touched.nodes.add(event.node)


@rule(MambaUnlock)
def mamba_unlock(s: Any, event: MambaUnlock) -> None:
    tier = tier_of(s)
    _tree_node(s, event.node)
    component = component_of(tier, event.node)
    if not component.lock_ref:
        raise Reject(f"Mamba unlock of node {event.node} below zero")
    if component.slot and component.lock_ref == 1:
        tier.protected -= 1
        tier.evictable += 1
    _setcomponent_of(tier, event.node,
                     MambaNode(component.slot, component.lock_ref - 1, component.stamp))
    if s.touched is not None:
        s.touched.nodes.add(event.node)


@rule(MambaEvict)
def mamba_evict(s: Any, event: MambaEvict) -> None:
    tier = tier_of(s)
    if not event.nodes:
        raise Reject("a Mamba eviction names no node")
    check_distinct(event.nodes, "node")
    for node_id in event.nodes:
        _tree_node(s, node_id)
        component = component_of(tier, node_id)
        if not component.slot:
            raise Reject(f"node {node_id} holds no Mamba state")
        if component.lock_ref:
            raise Reject(f"node {node_id}'s Mamba state is locked ({component.lock_ref})")
    slots = []
    for node_id in event.nodes:
        slot = tier.nodes.pop(node_id).slot
        del tier.slot_node[slot]
        slots.append(slot)
    tier.evictable -= len(slots)
    tier.free_slots = tier.free_slots.push_tail(slots)
    touch_slots(s, slots)
    if s.touched is not None:
        s.touched.nodes.update(event.nodes)
