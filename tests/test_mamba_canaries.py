"""Canaries: every Mamba invariant is live, from scratch and incrementally.

For each named check of ``kvstate.invariants.mamba`` there is a broken
variant of one rule (through the store interface, so it runs on the live
engine the front end drives).  Installed in ``kvstate.rules.RULES``, it must
make that check report, both in the full check and in the incremental one,
within the directed scripts of ``tools/diff_sglang_mamba.py`` (the worked
examples) or a short event script.
"""

from __future__ import annotations

import pytest

from kvstate import events as ev
from kvstate.engine import Engine
from kvstate.invariants import check
from kvstate.invariants.incremental import IncrementalChecker
from kvstate.invariants.mamba import MAMBA_CHECKS
from kvstate.rules import RULES
from kvstate.state import Geometry, MambaNode, initial_state
from tools.diff_sglang_mamba import generate
from tools.mamba_ops import apply_op
from tools.mamba_sides import Side


def free_frees_a_held_slot(core):
    def rule(s, e):
        core(s, e)
        for slot in list(s.mamba.snapshot("held").keys())[:1]:
            s.mamba.free_slots = s.mamba.free_slots.push_tail([slot])  # free, yet held
            if s.touched is not None:
                s.touched.mamba_slots.add(slot)
    return rule


def donate_keeps_the_old_entry(core):
    def rule(s, e):
        entries = s.mamba.rows[e.row]
        core(s, e)
        s.mamba.rows[e.row] = entries  # the row still lists the donated slot
    return rule


def commit_skips_the_index(core):
    def rule(s, e):
        core(s, e)
        del s.mamba.slot_node[e.slot]
    return rule


def lock_over_full(core):
    def rule(s, e):
        core(s, e)
        record = s.mamba.nodes[e.node]
        s.mamba.nodes[e.node] = record._replace(lock_ref=s.nodes[e.node].lock_ref + 1)
    return rule


def evict_ignores_lock(core):
    def rule(s, e):
        locks = {n: s.mamba.nodes[n].lock_ref for n in e.nodes if n in s.mamba.nodes}
        for node_id in locks:
            s.mamba.nodes[node_id] = s.mamba.nodes[node_id]._replace(lock_ref=0)
        core(s, e)
        for node_id, count in locks.items():
            if count:  # the lock stays, on a node that lost its state
                s.mamba.nodes[node_id] = MambaNode(0, count, 0)
    return rule


def touch_stamps_all(core):
    def rule(s, e):
        core(s, e)
        for node_id, record in list(s.mamba.snapshot("nodes").items()):
            if record.slot:
                s.mamba.nodes[node_id] = record._replace(stamp=e.time)
                if s.touched is not None:  # a wrong stamp, honestly reported
                    s.touched.nodes.add(node_id)
    return rule


def unlock_skips_sizes(core):
    def rule(s, e):
        core(s, e)
        s.mamba.evictable += 1
    return rule


CANARIES = {  # check: (event type, broken variant)
    "mamba_owned_once": (ev.MambaFree, free_frees_a_held_slot),
    "mamba_rows": (ev.MambaDonate, donate_keeps_the_old_entry),
    "mamba_node_states": (ev.MambaCommit, commit_skips_the_index),
    "mamba_full_covers_lock": (ev.MambaLock, lock_over_full),
    "mamba_hit_has_state": (ev.MambaEvict, evict_ignores_lock),
    "mamba_lru_total": (ev.MambaTouch, touch_stamps_all),
    "mamba_sizes": (ev.MambaUnlock, unlock_skips_sizes),
}

SCRIPTS = {  # the planner never evicts a locked state: a short event script does
    "mamba_hit_has_state": [ev.Allocate((1,)), ev.Insert(0, (7,), (1,), 1, 1),
                            ev.MambaAlloc((1,)), ev.MambaCommit(1, 1, 2), ev.Lock(1),
                            ev.MambaLock(1), ev.MambaEvict((1,))],
}


def test_every_mamba_check_has_a_canary():
    assert set(CANARIES) == set(MAMBA_CHECKS)


def _caught(name: str, engine: Engine, incremental: IncrementalChecker) -> tuple[bool, bool]:
    return (any(v.check == name for v in check(engine.view)),
            any(v.check == name for v in incremental.check()))


@pytest.mark.parametrize("name", sorted(CANARIES))
def test_canary_is_caught(name, monkeypatch):
    event_type, broken = CANARIES[name]
    monkeypatch.setitem(RULES, event_type, broken(RULES[event_type]))
    if name in SCRIPTS:
        engine = Engine(state=initial_state(Geometry(num_pages=4), mamba_slots=2))
        incremental = IncrementalChecker(engine.view)
        for event in SCRIPTS[name]:
            engine.apply(event)
        assert _caught(name, engine, incremental) == (True, True)
        return
    for config, page_size, seed in (("mamba-nobuf", 1, -1), ("mamba-extra", 4, -1),
                                    ("mamba-extra", 1, -2), ("swa-mamba-extra", 1, -2)):
        setup, ops = generate(config, seed, 0, page_size)
        side = Side("kvstate", "-", setup)
        engine = side.cache.engine
        incremental = IncrementalChecker(engine.view)
        for op in ops:
            apply_op(side, op)
            full, partial = _caught(name, engine, incremental)
            if full or partial:
                assert (full, partial) == (True, True)
                return
    pytest.fail(f"no directed script broke {name}")
