"""Spec findings: sequences whose last event the core once got wrong.

For a finding in ``FINDINGS`` the core once accepted the last event; now the
spec model and both backends reject it and the state is unchanged.  For one
in ``RESULT_FINDINGS`` the last event is legal but the core once left a
wrong state; now both backends' result refines the spec's and passes every
named check.
"""

from __future__ import annotations

import pytest

from kvstate import apply
from kvstate.backends.live import LiveState
from kvstate.canonical import fingerprint
from kvstate.checking.levels import check_refinement
from kvstate.errors import InvalidEvent
from kvstate.state import initial_state
from specs.abstraction import abstract, abstract_any
from specs.findings import FINDINGS, POOLS, RESULT_FINDINGS
from specs.model import ModelReject, step, step_any


def _replay_prefix(table, name):
    geometry, events = table[name]
    state = initial_state(geometry, **POOLS.get(name, {}))
    for event in events[:-1]:
        state = apply(state, event)
    return state, events[-1]


@pytest.mark.parametrize("name", sorted(FINDINGS))
def test_spec_rejects_the_final_event(name):
    state, last = _replay_prefix(FINDINGS, name)
    with pytest.raises(ModelReject):
        step_any(abstract_any(state), last)


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


@pytest.mark.parametrize("name", sorted(RESULT_FINDINGS))
def test_a_legal_final_event_leaves_the_spec_state(name):
    from specs.invariants import check_state

    state, last = _replay_prefix(RESULT_FINDINGS, name)
    model = step(abstract(state), last)
    after = apply(state, last)
    assert abstract(after) == model
    assert check_refinement(state, last, after, None) == []
    assert check_state(after) == []
    live = LiveState.thaw(state)
    live.apply(last)
    assert live.fingerprint() == after.fingerprint()
