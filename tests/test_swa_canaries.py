"""Canaries: every SWA invariant is live, from scratch and incrementally.

For each named check of ``kvstate.invariants.swa`` there is a broken variant
of one rule (through the store interface, so it runs on the live engine the
front end drives).  Installed in ``kvstate.rules.RULES``, it must make that
check report, both in the full check and in the incremental one, within
the directed scripts of ``tools/diff_sglang_hybrid.py`` (the worked
examples) or a three-event script.
"""

from __future__ import annotations

import pytest

from kvstate import events as ev
from kvstate.engine import Engine
from kvstate.invariants import check
from kvstate.invariants.incremental import IncrementalChecker
from kvstate.invariants.swa import SWA_CHECKS
from kvstate.rules import RULES
from kvstate.state import Geometry, initial_state
from tools.diff_sglang_hybrid import generate
from tools.hybrid_ops import apply_op
from tools.hybrid_sides import Side


def swa_free_frees_a_neighbour(core):
    def rule(s, e):
        core(s, e)
        for full, page in list(s.swa.snapshot("peer").items())[:1]:
            s.swa.free_pages = s.swa.free_pages.push_tail([page])  # free, yet still paired
            if s.touched is not None:
                s.touched.pages.add(full)
    return rule


def free_ignores_peer(core):
    def rule(s, e):
        kept = {page: s.swa.peer.pop(page) for page in e.pages if page in s.swa.peer}
        core(s, e)
        s.swa.peer.update(kept)  # the FULL page went free with its SWA page
    return rule


def swa_evict_keeps_live(core):
    def rule(s, e):
        core(s, e)
        for node_id in e.nodes:
            node = s.node_w(node_id)
            node.swa = node.swa._replace(live=True, stamp=s.clock)
    return rule


def swa_lock_over_full(core):
    def rule(s, e):
        core(s, e)
        node = s.node_w(e.node)
        node.swa = node.swa._replace(lock_ref=node.lock_ref + 1)
    return rule


def swa_evict_ignores_lock(core):
    def rule(s, e):
        locks = {}
        for node_id in e.nodes:
            node = s.node_w(node_id)
            locks[node_id], node.swa = node.swa.lock_ref, node.swa._replace(lock_ref=0)
        core(s, e)
        for node_id, count in locks.items():
            node = s.node_w(node_id)
            node.swa = node.swa._replace(lock_ref=count)
    return rule


def swa_lock_reuses_receipt(core):
    def rule(s, e):
        before = s.swa.next_uuid
        core(s, e)
        s.swa.next_uuid = before
    return rule


def swa_touch_stamps_all(core):
    def rule(s, e):
        core(s, e)
        for node_id in list(s.snapshot("nodes").keys()):
            node = s.nodes[node_id]
            if node.swa is not None and node.swa.live:
                s.node_w(node_id).swa = node.swa._replace(stamp=e.time)
                if s.touched is not None:  # a wrong stamp, honestly reported
                    s.touched.nodes.add(node_id)
    return rule


def swa_unlock_skips_sizes(core):
    def rule(s, e):
        core(s, e)
        s.swa.evictable += 1
    return rule


CANARIES = {  # check: (event type, broken variant)
    "swa_owned_once": (ev.SwaFree, swa_free_frees_a_neighbour),
    "swa_peer_held": (ev.Free, free_ignores_peer),
    "swa_node_peers": (ev.SwaEvict, swa_evict_keeps_live),
    "swa_full_covers_lock": (ev.SwaLock, swa_lock_over_full),
    "swa_locked_window_live": (ev.SwaEvict, swa_evict_ignores_lock),
    "swa_receipts": (ev.SwaLock, swa_lock_reuses_receipt),
    "swa_lru_total": (ev.SwaTouch, swa_touch_stamps_all),
    "swa_sizes": (ev.SwaUnlock, swa_unlock_skips_sizes),
}


SCRIPTS = {
    "swa_peer_held": [ev.Allocate((1,)), ev.SwaAlloc(((1, 1),)), ev.Free((1,))],
    "swa_locked_window_live": [ev.Allocate((1,)), ev.SwaAlloc(((1, 1),)),
                               ev.Insert(0, (7,), (1,), 1, 1), ev.Lock(1), ev.SwaLock(1, 1, 1),
                               ev.SwaEvict((1,))],
}


def test_every_swa_check_has_a_canary():
    assert set(CANARIES) == set(SWA_CHECKS)


def _caught(name: str, engine: Engine, incremental: IncrementalChecker) -> tuple[bool, bool]:
    return (any(v.check == name for v in check(engine.view)),
            any(v.check == name for v in incremental.check()))


@pytest.mark.parametrize("name", sorted(CANARIES))
def test_canary_is_caught(name, monkeypatch):
    event_type, broken = CANARIES[name]
    monkeypatch.setitem(RULES, event_type, broken(RULES[event_type]))
    if name in SCRIPTS:  # the planner never emits these: a short event script does
        engine = Engine(state=initial_state(Geometry(num_pages=4), swa_pages=2))
        incremental = IncrementalChecker(engine.view)
        for event in SCRIPTS[name]:
            engine.apply(event)
        assert _caught(name, engine, incremental) == (True, True)
        return
    for script, page_size in ((-2, 1), (-1, 1), (-1, 4)):
        window, interval, ops = generate(script, 0, page_size)
        side = Side("kvstate", "-", page_size, window)
        engine = side.cache.engine
        incremental = IncrementalChecker(engine.view)
        for op in ops:
            apply_op(side, op, interval)
            full, partial = _caught(name, engine, incremental)
            if full or partial:
                assert (full, partial) == (True, True)
                return
    pytest.fail(f"no directed script broke {name}")
