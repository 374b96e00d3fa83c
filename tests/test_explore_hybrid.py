"""The explorer on the hybrid pools' scopes: ``swa`` (FULL + SWA) and ``mamba``.

``mamba`` is pinned with the others (tests/test_explore_small.py); ``swa`` is
pinned here.  The ``swa`` scope found finding F10 (a window lock accepted over
an SWA tombstone, breaking ``swa_locked_window_live``), now refused by the
rules and the spec model (specs/findings.py, replay/findings/).  The canaries
of tests/test_swa_canaries.py / test_mamba_canaries.py are caught on these
scopes.
"""

from __future__ import annotations

import pytest

from kvstate.checking import SCOPES, EventLevel, explore, run_check
from kvstate.checking.scopes import Scope
from kvstate.invariants.mamba import MAMBA_CHECKS
from kvstate.invariants.swa import SWA_CHECKS
from kvstate.rules import RULES
from tests import test_mamba_canaries as mamba_canaries
from tests import test_swa_canaries as swa_canaries

SWA_PINNED = (6294, 18332)


def _only(monkeypatch, keep: set[str]) -> None:
    for registry in (SWA_CHECKS, MAMBA_CHECKS):
        for name in list(registry):
            if name not in keep:
                monkeypatch.delitem(registry, name)


def test_swa_scope_pinned(tmp_path):
    report = run_check("swa", log_dir=tmp_path)
    assert report.violation is None, report.as_json()["violations"]
    assert report.sometimes_missed == []
    assert set(report.sometimes_hit) == set(SCOPES["swa"].probes)
    assert (report.unique_states, report.edges) == SWA_PINNED


def test_hybrid_scopes_validate():
    with pytest.raises(ValueError, match="symmetry"):
        Scope("x", "event", 2, 1, 1, 1, 3, kinds=("swa_alloc",), swa_pages=1)
    with pytest.raises(ValueError, match="swa_pages"):
        Scope("x", "event", 2, 1, 1, 1, 3, kinds=("swa_alloc",), symmetry=False)
    with pytest.raises(ValueError, match="mamba_slots"):
        Scope("x", "event", 2, 1, 1, 1, 3, kinds=("mamba_copy",), symmetry=False)
    with pytest.raises(ValueError, match="radix"):
        Scope("x", "event", 2, 1, 1, 1, 3, mode="block", swa_pages=1, symmetry=False)


CAUGHT = [  # (scope, canary table, invariant, depth the explorer needs at most)
    ("swa", swa_canaries.CANARIES, "swa_receipts", 5),
    ("swa", swa_canaries.CANARIES, "swa_node_peers", 5),
    ("swa", swa_canaries.CANARIES, "swa_peer_held", 4),
    ("mamba", mamba_canaries.CANARIES, "mamba_full_covers_lock", 6),
    ("mamba", mamba_canaries.CANARIES, "mamba_node_states", 5),
    ("mamba", mamba_canaries.CANARIES, "mamba_owned_once", 3),
]


@pytest.mark.parametrize(("scope", "table", "name", "depth"), CAUGHT,
                         ids=[name for _, _, name, _ in CAUGHT])
def test_explorer_catches_hybrid_canary(scope, table, name, depth, monkeypatch):
    event_type, broken = table[name]
    monkeypatch.setitem(RULES, event_type, broken(RULES[event_type]))
    _only(monkeypatch, {name})
    report = explore(EventLevel(SCOPES[scope], check_model=False), max_depth=depth, probes=())
    assert report.violation is not None, f"{name} went unnoticed"
    assert name in report.violation.names
    # with the spec model on, the model notices the broken rule too (or first)
    report = explore(EventLevel(SCOPES[scope]), max_depth=depth, probes=())
    assert report.violation is not None
    assert set(report.violation.names) & {"refines", name}


def test_swa_counterexample_log_replays(tmp_path, monkeypatch):
    """A violation's log carries the SWA pool: its events replay to the violating state."""
    from kvstate import apply
    from kvstate.checking.counterexample import read_log
    from kvstate.invariants import check
    from kvstate.log.reader import read_events
    from kvstate.state import initial_state

    event_type, broken = swa_canaries.CANARIES["swa_receipts"]
    monkeypatch.setitem(RULES, event_type, broken(RULES[event_type]))
    report = run_check("swa", log_dir=tmp_path)
    assert report.violation is not None and report.log_path
    header, _ = read_events(report.log_path)
    geometry, events, meta = read_log(report.log_path)
    assert header.swa_pages == SCOPES["swa"].swa_pages
    state = initial_state(geometry, swa_pages=header.swa_pages)
    for event in events:
        state = apply(state, event)
    # the model notices the broken rule first ("refines"); the state it left breaks the
    # canary's invariant as well
    assert meta["expect"]["violation"]
    assert "swa_receipts" in {v.check for v in check(state)}
