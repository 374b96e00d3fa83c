"""Findings of the spec (specs/SPEC.md, "Findings"): fixed ones are regressions, open ones
wait for a core change.

Each finding is an exact event sequence.  For a fixed one (``FINDINGS``) the
core once accepted the last event; now the spec model and both backends
reject it and the state is unchanged.  For an open one (``OPEN_FINDINGS``)
the spec and the core still disagree on the last event: the spec rejects it,
or both accept it with different results; the core side is a strict xfail,
so the fix fails this test until the entry moves to ``FINDINGS``.
"""

from __future__ import annotations

import pytest

from kvstate import apply
from kvstate.backends.live import LiveState
from kvstate.canonical import fingerprint
from kvstate.checking.levels import check_refinement
from kvstate.errors import InvalidEvent
from kvstate.state import initial_state
from specs.abstraction import abstract
from specs.findings import FINDINGS, OPEN_FINDINGS
from specs.model import ModelReject, step


def _replay_prefix(table, name):
    geometry, events = table[name]
    state = initial_state(geometry)
    for event in events[:-1]:
        state = apply(state, event)
    return state, events[-1]


@pytest.mark.parametrize("name", sorted(FINDINGS))
def test_spec_rejects_the_final_event(name):
    state, last = _replay_prefix(FINDINGS, name)
    with pytest.raises(ModelReject):
        step(abstract(state), last)


@pytest.mark.parametrize("name", sorted(FINDINGS))
def test_core_rejects_the_final_event(name):
    state, last = _replay_prefix(FINDINGS, name)
    before = state.fingerprint()  # cached on the object from here on
    with pytest.raises(InvalidEvent):
        apply(state, last)
    # Recomputed from the state's current contents, bypassing the cache: a rejected
    # event must not have mutated anything the canonical encoding covers.
    assert fingerprint(state) == before
    live = LiveState.thaw(state)
    with pytest.raises(InvalidEvent):
        live.apply(last)
    assert live.fingerprint() == before


@pytest.mark.parametrize("name", sorted(OPEN_FINDINGS))
def test_open_finding_the_spec_decides(name):
    """The spec's side is settled: it rejects the event, or accepts it with a result the
    core's own named checks hold on."""
    from specs.invariants import check_state

    state, last = _replay_prefix(OPEN_FINDINGS, name)
    try:
        model = step(abstract(state), last)
    except ModelReject:
        return
    assert model is not None
    core = apply(state, last)
    assert check_state(core), "the core's result breaks none of its own checks"


@pytest.mark.xfail(strict=True, reason="open finding: needs a change to kvstate/rules")
@pytest.mark.parametrize("name", sorted(OPEN_FINDINGS))
def test_open_finding_the_core_agrees(name):
    state, last = _replay_prefix(OPEN_FINDINGS, name)
    try:
        after = apply(state, last)
        error = None
    except InvalidEvent as exc:
        after, error = None, exc.precondition
    assert check_refinement(state, last, after, error) == []
