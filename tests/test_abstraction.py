"""The refinement map: ``abstract`` and its fast comparison ``agrees`` give the same answer.

The explorer compares each successor with the spec model through ``agrees``
(no abstraction built); failures are explained with ``abstract``.  On every
state of the pinned event-level scopes (radix, rows, block, host), a state
agrees with its own abstraction, and with no model that differs from it in
any one field.
"""

from __future__ import annotations

import copy

import pytest

from kvstate.checking import SCOPES, EventLevel
from specs.abstraction import abstract, agrees
from specs.model import MNode, MRequest


def _states(scope_name: str, limit: int = 400) -> list:
    level = EventLevel(SCOPES[scope_name], check_model=False)
    seen, frontier, out = set(), [level.initial()], []
    while frontier and len(out) < limit:
        state = frontier.pop()
        fp = state.fingerprint()
        if fp in seen:
            continue
        seen.add(fp)
        out.append(state)
        frontier.extend(step.world for step in level.expand(state) if step.world is not None)
    return out


def _perturbations(model):
    """Copies of ``model`` that differ from it in one field."""
    for name in ("clock", "next_node"):
        other = copy.deepcopy(model)
        setattr(other, name, getattr(model, name) + 1)
        yield other
    other = copy.deepcopy(model)
    other.free = other.free[::-1] if len(other.free) > 1 else other.free + [99]
    yield other
    if model.requests:
        rid = sorted(model.requests, key=str)[0]
        for change in ("allocated", "committed", "pages", "dangling"):
            other = copy.deepcopy(model)
            record: MRequest = other.requests[rid]
            if change == "pages":
                record.pages.append(0)
            elif change == "dangling":
                record.dangling.append(99)
            else:
                setattr(record, change, getattr(record, change) + 1)
            yield other
    for node_id in sorted(model.nodes)[-1:]:
        for change in ("lock_ref", "last_access", "pages", "extra"):
            other = copy.deepcopy(model)
            node: MNode = other.nodes[node_id]
            if change == "pages":
                node.pages.append(99)
            elif change == "extra":
                node.extra = ("x",)
            else:
                setattr(node, change, getattr(node, change) + 1)
            yield other
    if model.holders:
        other = copy.deepcopy(model)
        page = sorted(other.holders)[0]
        other.holders[page] = other.holders[page] | {"someone"}
        yield other


@pytest.mark.parametrize("scope", ["tiny", "paged", "rows-sglang-paged", "block", "host"])
def test_agrees_is_abstract_equality(scope):
    states = _states(scope)
    assert len(states) >= 100
    for state in states:
        model = abstract(state)
        assert agrees(state, model)
        for other in _perturbations(model):
            assert other != model
            assert not agrees(state, other)
