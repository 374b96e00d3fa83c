"""Reducer findings of the spec (specs/SPEC.md, "Findings"), now regressions.

Each finding is an exact event sequence whose last event the core once
accepted and must reject.  The spec model rejects it, the core rejects it,
and the sequence is also committed as a log under ``replay/findings/``.
"""

from __future__ import annotations

import pytest

from kvstate.encoding import fingerprint
from kvstate.errors import InvalidEvent
from kvstate.reducer import apply
from kvstate.state import initial_state
from specs.abstraction import abstract
from specs.findings import FINDINGS
from specs.model import ModelReject, step


def _replay_prefix(name):
    geometry, events = FINDINGS[name]
    state = initial_state(geometry)
    for event in events[:-1]:
        state = apply(state, event)
    return state, events[-1]


@pytest.mark.parametrize("name", sorted(FINDINGS))
def test_spec_rejects_the_final_event(name):
    state, last = _replay_prefix(name)
    with pytest.raises(ModelReject):
        step(abstract(state), last)


@pytest.mark.parametrize("name", sorted(FINDINGS))
def test_core_rejects_the_final_event(name):
    state, last = _replay_prefix(name)
    before = state.fingerprint()  # cached on the object from here on
    with pytest.raises(InvalidEvent):
        apply(state, last)
    # Recomputed from the state's current contents, bypassing the cache: a rejected
    # event must not have mutated anything the canonical encoding covers.
    assert fingerprint(state) == before
