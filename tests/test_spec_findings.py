"""Reducer findings of the spec (specs/SPEC.md, "Findings"): events the core accepts
but must reject.  Each test asserts the core rejects the last event of the
finding's exact sequence, and is an expected failure until the core is fixed
(``strict``: once fixed, the xfail turns into a failure that says to drop the
marker and ``tests/spec_fixes.py``).  The spec model already rejects each one.
"""

from __future__ import annotations

import pytest

from kvstate.errors import InvalidEvent
from kvstate.reducer import apply
from kvstate.state import initial_state
from specs.abstraction import abstract
from specs.model import ModelReject, step
from tests.spec_fixes import FINDINGS, proposed_fixes


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
def test_proposed_fix_rejects_the_final_event(name):
    with proposed_fixes():
        state, last = _replay_prefix(name)
        with pytest.raises(InvalidEvent):
            apply(state, last)


@pytest.mark.xfail(strict=True, reason="reducer finding reported to the lead; fix proposed in "
                                       "tests/spec_fixes.py")
@pytest.mark.parametrize("name", sorted(FINDINGS))
def test_core_rejects_the_final_event(name):
    state, last = _replay_prefix(name)
    with pytest.raises(InvalidEvent):
        apply(state, last)
