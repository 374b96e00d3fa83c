"""Canaries for the host-tier invariants (specs/SPEC.md H1-H3) through the planner.

Each variant breaks one shared rule (``tests/canary_rules.py``, installed in
``kvstate.rules.RULES`` so both backends run it).  A short write-through flow
through the planner must trip exactly the named check, and the stateful
``HostTierMachine`` (planner flows on a live engine with the executor's
integrity check) must catch the variant too.  The event-level canaries of
the same properties are in tests/test_canaries.py.
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

import tests.canary_rules as broken_rules
from kvstate import Geometry, apply
from kvstate.events import Allocate, Evict, Offload, Split
from kvstate.invariants import check
from kvstate.planner.builder import PlanBuilder
from kvstate.planner.host import WRITE_THROUGH, plan_insert_tiered, plan_match_tiered
from kvstate.rules import RULES
from kvstate.state import initial_state
from tests.test_host_tier import HostTierMachine

MACHINE_SETTINGS = settings(max_examples=300, stateful_step_count=25, deadline=None,
                            derandomize=True, database=None, phases=[Phase.generate],
                            report_multiple_bugs=False)

CANARIES = {
    "host_owned_once": (Offload, broken_rules.offload_leaves_pages_free),
    "host_root_closed": (Split, broken_rules.split_keeps_backup_below),
    "host_only_keeps_key": (Evict, broken_rules.evict_forgets_key),
}


@pytest.fixture(params=sorted(CANARIES))
def canary(request, monkeypatch):
    name = request.param
    event_type, factory = CANARIES[name]
    monkeypatch.setitem(RULES, event_type, factory(RULES[event_type]))
    return name


def write_through_flow():
    """Cache [1..8] with a write-through backup, split it by a partial hit, evict it to host."""
    geometry = Geometry(num_pages=6, page_size=2, num_rows=4, row_width=64)
    state = apply(initial_state(geometry, host_pages=8), Allocate((1, 2, 3, 4)))
    states = [state]
    b = PlanBuilder(state)
    plan_insert_tiered(b, [1, 2, 3, 4, 5, 6, 7, 8], [2, 3, 4, 5, 6, 7, 8, 9], 0,
                       policy=WRITE_THROUGH, at_head=True)
    states.append(b.state)
    b = PlanBuilder(b.state)
    plan_match_tiered(b, [1, 2, 3, 4, 9], policy=WRITE_THROUGH, at_head=True)
    states.append(b.state)  # node 1 split at 4 tokens: new top node 2, bottom stays 1
    states.append(apply(b.state, Evict((1,), True)))  # bottom half to host only
    return states


def test_the_flow_is_clean_with_the_real_rules():
    states = write_through_flow()
    assert all(check(state) == [] for state in states)
    final = states[-1]
    assert 1 in final.host.evicted and dict(final.host.backup) == {1: (2, 3), 2: (0, 1)}


def test_the_flow_trips_exactly_the_broken_check(canary):
    """The first state with a violation violates only the broken property (later ones may cascade)."""
    found = next((violations for violations in map(check, write_through_flow()) if violations), [])
    assert found, f"{canary} was not caught"
    assert {violation.check for violation in found} == {canary}


def test_the_host_tier_machine_catches_the_variant(canary):
    with pytest.raises(AssertionError, match=canary):
        run_state_machine_as_test(HostTierMachine, settings=MACHINE_SETTINGS)
