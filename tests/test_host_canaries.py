"""Canaries for the host-tier invariants (specs/SPEC.md H1-H3): each check is live.

Each variant breaks one rule of the tiered reducer.  A short tiered flow
through the planner must trip exactly the named check, and the stateful
``HostTierMachine`` (planner flows with the executor's integrity check)
must catch the variant too.
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvstate import Geometry
from kvstate.events import Allocate, Evict, Split
from kvstate.events_host import Offload
from kvstate.invariants_host import check_host
from kvstate.planner.host import WRITE_THROUGH, plan_insert_tiered, plan_match_tiered
from kvstate.reducer import host as tier
from kvstate.state import initial_state
from kvstate.state_host import HostNode, tiered
from tests.test_host_tier import HostTierMachine

MACHINE_SETTINGS = settings(max_examples=300, stateful_step_count=25, deadline=None,
                            derandomize=True, database=None, phases=[Phase.generate],
                            report_multiple_bugs=False)


def offload_leaves_pages_free(rule):
    """H1: the backup takes host pages without taking them off the host free list."""
    def broken(state, event):
        out = rule(state, event)
        return out.replace(host=tier._evolve(out.host, free_pages=state.host.free_pages))
    return broken


def split_keeps_backup_below(rule):
    """H2: a split leaves every host page with the bottom half; the new top has no copy."""
    def broken(state, event):
        out = rule(state, event)
        pages = state.host.backup.get(event.node)
        if pages is None:
            return out
        backup = out.host.backup.delete(event.new_node).set(event.node, pages)
        owner = out.host.owner.update({page: event.node for page in pages})
        return out.replace(host=tier._evolve(out.host, backup=backup, owner=owner))
    return broken


def evict_forgets_key(rule):
    """H3: an evicted backed-up node keeps its id but loses its key."""
    def broken(state, event):
        out = rule(state, event)
        evicted = out.host.evicted
        for node_id in event.nodes:
            record = evicted.get(node_id)
            if record is not None:
                evicted = evicted.set(node_id, HostNode(record.parent, (), record.last_access))
        return out.replace(host=tier._evolve(out.host, evicted=evicted))
    return broken


CANARIES = {
    "host_owned_once": (Offload, offload_leaves_pages_free),
    "host_root_closed": (Split, split_keeps_backup_below),
    "host_only_keeps_key": (Evict, evict_forgets_key),
}


@pytest.fixture(params=sorted(CANARIES))
def canary(request, monkeypatch):
    name = request.param
    event_type, factory = CANARIES[name]
    monkeypatch.setitem(tier.TIER_RULES, event_type, factory(tier.TIER_RULES[event_type]))
    return name


def write_through_flow():
    """Cache [1..8] with a write-through backup, split it by a partial hit, evict it to host."""
    state = tiered(initial_state(Geometry(num_pages=6, page_size=2, num_rows=4, row_width=64)), 8)
    state = tier.apply_tiered(state, Allocate((1, 2, 3, 4)))
    states = [state]
    plan = plan_insert_tiered(state, [1, 2, 3, 4, 5, 6, 7, 8], [2, 3, 4, 5, 6, 7, 8, 9], 0,
                              policy=WRITE_THROUGH, at_head=True)
    states.append(plan.state)
    plan = plan_match_tiered(plan.state, [1, 2, 3, 4, 9], policy=WRITE_THROUGH, at_head=True)
    states.append(plan.state)  # node 1 split at 4 tokens: new top node 2, bottom stays 1
    states.append(tier.apply_tiered(plan.state, Evict((1,), True)))  # bottom half to host only
    return states


def test_the_flow_is_clean_with_the_real_rules():
    states = write_through_flow()
    assert all(check_host(state) == [] for state in states)
    final = states[-1]
    assert 1 in final.host.evicted and dict(final.host.backup) == {1: (2, 3), 2: (0, 1)}


def test_the_flow_trips_exactly_the_broken_check(canary):
    """The first state with a violation violates only the broken property (later ones may cascade)."""
    found = next((violations for violations in map(check_host, write_through_flow()) if violations), [])
    assert found, f"{canary} was not caught"
    assert {violation.check for violation in found} == {canary}


def test_the_host_tier_machine_catches_the_variant(canary):
    with pytest.raises(AssertionError, match=canary):
        run_state_machine_as_test(HostTierMachine, settings=MACHINE_SETTINGS)
