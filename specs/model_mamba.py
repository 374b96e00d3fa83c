"""Reference model of a hybrid cache with a Mamba state pool (FULL + MAMBA, FULL + SWA + MAMBA).

Written from the Mamba event docstrings (``kvstate.events.mamba``), the
invariants (``kvstate.invariants.mamba``) and the FULL rules' Mamba clauses
documented in ``kvstate.rules.tree`` / ``rows``, never from the rules' code.
A ``MambaModel`` is the model of the rest of the cache (the core
``ModelState``, or with an SWA pool ``specs.model_swa.HybridModel``) plus a
``ModelMamba``: the free list in queue order, who holds each held slot, each
row's entries and each node's record ``[slot, lock_ref, stamp]``.  The sizes
and the LRU order are derived by scanning.  ``step_mamba`` returns a new
model or raises ``ModelReject``; it never mutates its input.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from specs.model import step as core_step
from specs.model_state import DETACHED, ROOT, ModelReject, ModelState, require
from specs.model_swa import HybridModel, abstract_hybrid, step_hybrid


@dataclass
class ModelMamba:
    num_slots: int
    free: list[int]
    held: dict[int, Any] = field(default_factory=dict)  # slot -> row, or DETACHED
    rows: dict[Any, list[int]] = field(default_factory=dict)  # row -> entries (0: empty)
    node: dict[int, list[int]] = field(default_factory=dict)  # node -> [slot, lock_ref, stamp]

    def states(self) -> dict[int, int]:
        """slot -> the node whose state it is."""
        return {record[0]: n for n, record in self.node.items() if record[0]}


@dataclass
class MambaModel:
    rest: Any  # a ModelState, or a HybridModel with an SWA pool
    mamba: ModelMamba

    @property
    def core(self) -> ModelState:
        return self.rest.core if isinstance(self.rest, HybridModel) else self.rest


def step_mamba(m: MambaModel, event: Any) -> MambaModel:
    """The model after ``event`` (a Mamba event or any other event of the cache)."""
    out = copy.deepcopy(m)
    name = type(event).__name__
    rule = MAMBA_RULES.get(name)
    if rule is not None:
        rule(out, event)
        return out
    _before(out, name, event)
    out.rest = step_hybrid(m.rest, event) if isinstance(m.rest, HybridModel) else \
        core_step(m.rest, event)
    _after(out, m, name, event)
    return out


# -- the other events' Mamba clauses ----------------------------------------------------------
def _before(m: MambaModel, name: str, e: Any) -> None:
    core, mamba = m.core, m.mamba
    if name == "Evict":
        require(not any(mamba.node.get(n, [0])[0] for n in e.nodes),
                "a node with a Mamba state is not evicted")
    elif name == "Unlock" and e.node in core.nodes and e.node != ROOT:
        for node_id in core.path(e.node):
            locks = mamba.node.get(node_id, [0, 0])[1]
            require(core.nodes[node_id].lock_ref - 1 >= locks,
                    "a Mamba lock would outlive its FULL lock")


def _after(m: MambaModel, before: MambaModel, name: str, e: Any) -> None:
    mamba = m.mamba
    closed: list[Any] = []
    if name == "ReqFree":
        closed = list(e.requests)
    elif name == "Reset" and e.scope in ("rows", "all"):
        closed = list(before.core.requests)
    for row in closed:  # a closed row's slots stay held, DETACHED
        for slot in mamba.rows.pop(row, []):
            if slot:
                mamba.held[slot] = DETACHED
    if name == "Reset" and e.scope in ("tree", "all"):
        mamba.free = mamba.free + sorted(mamba.states())
        mamba.node = {}
    if name == "Reset" and e.scope in ("pages", "all"):
        mamba.free, mamba.held, mamba.rows = list(range(1, mamba.num_slots + 1)), {}, {}


# -- the Mamba events ----------------------------------------------------------------------
def _node(m: MambaModel, node_id: int) -> list[int]:
    require(node_id != ROOT and node_id in m.core.nodes, f"no tree node {node_id}")
    return m.mamba.node.get(node_id, [0, 0, 0])


def _time(m: MambaModel, time: int) -> None:
    require(time >= m.core.clock, "time before the clock")
    m.core.clock = time


def _unhold(mamba: ModelMamba, slot: int) -> None:
    holder = mamba.held.pop(slot)
    if holder != DETACHED:
        entries = [0 if s == slot else s for s in mamba.rows[holder]]
        if any(entries):
            mamba.rows[holder] = entries
        else:
            del mamba.rows[holder]


def _store(mamba: ModelMamba, node_id: int, record: list[int]) -> None:
    if record[0] or record[1]:
        mamba.node[node_id] = record
    else:
        mamba.node.pop(node_id, None)


def mamba_alloc(m: MambaModel, e: Any) -> None:
    mamba = m.mamba
    require(len(e.slots) > 0 and len(set(e.slots)) == len(e.slots), "no slot, or twice")
    require(all(s in mamba.free for s in e.slots), "a slot is not free")
    for slot in e.slots:
        mamba.free.remove(slot)
        mamba.held[slot] = DETACHED


def mamba_bind(m: MambaModel, e: Any) -> None:
    mamba = m.mamba
    require(e.row != DETACHED and e.row in m.core.requests, "not an open row")
    require(e.row not in mamba.rows, "the row has Mamba slots already")
    live = [s for s in e.slots if s]
    require(len(e.slots) > 0 and e.slots[0] != 0, "the running slot comes first")
    require(len(set(live)) == len(live), "a slot twice")
    require(all(mamba.held.get(s, -1) == DETACHED for s in live), "slots must be DETACHED")
    mamba.rows[e.row] = list(e.slots)
    for slot in live:
        mamba.held[slot] = e.row


def mamba_free(m: MambaModel, e: Any) -> None:
    mamba = m.mamba
    require(len(e.slots) > 0 and len(set(e.slots)) == len(e.slots), "no slot, or twice")
    require(all(s in mamba.held for s in e.slots), "only held slots are freed")
    for slot in e.slots:
        _unhold(mamba, slot)
    mamba.free = mamba.free + list(e.slots)


def mamba_donate(m: MambaModel, e: Any) -> None:
    mamba = m.mamba
    entries = mamba.rows.get(e.row)
    require(entries is not None, "the row holds no Mamba slots")
    assert entries is not None
    require(1 <= e.index < len(entries) and entries[e.index] != 0, "no such track entry")
    require(mamba.held.get(e.fresh, -1) == DETACHED, "the fresh slot must be DETACHED")
    mamba.held[entries[e.index]] = DETACHED
    entries[e.index] = e.fresh
    mamba.held[e.fresh] = e.row


def mamba_copy(m: MambaModel, e: Any) -> None:
    mamba = m.mamba
    require(e.src != e.dst, "a copy onto itself")
    require(e.src in mamba.held or e.src in mamba.states(), "the source holds no state")
    require(e.dst in mamba.held, "the destination is not held")


def mamba_commit(m: MambaModel, e: Any) -> None:
    record = _node(m, e.node)
    require(record[0] == 0, "the node has a state already")
    require(e.slot in m.mamba.held, "the slot is not held")
    _time(m, e.time)
    _unhold(m.mamba, e.slot)
    _store(m.mamba, e.node, [e.slot, record[1], e.time])


def mamba_touch(m: MambaModel, e: Any) -> None:
    record = _node(m, e.node)
    require(record[0] != 0, "no state to touch")
    _time(m, e.time)
    record[2] = e.time


def mamba_lock(m: MambaModel, e: Any) -> None:
    record = _node(m, e.node)
    require(record[0] != 0, "a lock needs a state")
    require(m.core.nodes[e.node].lock_ref > record[1], "FULL must cover Mamba")
    _store(m.mamba, e.node, [record[0], record[1] + 1, record[2]])


def mamba_unlock(m: MambaModel, e: Any) -> None:
    record = _node(m, e.node)
    require(record[1] > 0, "Mamba unlock below zero")
    _store(m.mamba, e.node, [record[0], record[1] - 1, record[2]])


def mamba_evict(m: MambaModel, e: Any) -> None:
    require(len(e.nodes) > 0 and len(set(e.nodes)) == len(e.nodes), "no node, or twice")
    for node_id in e.nodes:
        record = _node(m, node_id)
        require(record[0] != 0 and record[1] == 0, f"node {node_id}: no unlocked state")
    slots = [m.mamba.node.pop(node_id)[0] for node_id in e.nodes]
    m.mamba.free = m.mamba.free + slots


MAMBA_RULES = {"MambaAlloc": mamba_alloc, "MambaBind": mamba_bind, "MambaFree": mamba_free,
               "MambaDonate": mamba_donate, "MambaCopy": mamba_copy, "MambaCommit": mamba_commit,
               "MambaTouch": mamba_touch, "MambaLock": mamba_lock, "MambaUnlock": mamba_unlock,
               "MambaEvict": mamba_evict}


def sizes(m: MambaModel) -> tuple[int, int]:
    """(evictable, protected) states, by scanning."""
    locked = sum(1 for record in m.mamba.node.values() if record[0] and record[1])
    return len(m.mamba.states()) - locked, locked


def abstract_mamba(state: Any) -> MambaModel:
    """The refinement mapping for a state with a Mamba pool (frozen or live)."""
    from specs.abstraction import abstract

    tier = state.mamba
    rest = abstract_hybrid(state) if state.swa is not None else abstract(state)
    return MambaModel(rest, ModelMamba(
        tier.num_slots, list(tier.free_slots), dict(tier.held.items()),
        {row: list(entries) for row, entries in tier.rows.items()},
        {n: [c.slot, c.lock_ref, c.stamp] for n, c in tier.nodes.items()}))


__all__ = ["MAMBA_RULES", "MambaModel", "ModelMamba", "ModelReject", "abstract_mamba", "sizes",
           "step_mamba"]
