"""``PlanBuilder``: accumulate events while tracking the state they produce.

The builder is a local scratch object (it mutates itself, never the states it
sees); a finished ``Plan`` is immutable.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import attrs

from kvstate.events import Event
from kvstate.reducer import apply
from kvstate.state import State

R = TypeVar("R")


@attrs.frozen
class Plan(Generic[R]):
    """Events to log, the state after them, and the decision's result."""

    events: tuple[Event, ...]
    state: State
    result: R
    base: State  # the state the plan was computed from
    states: tuple[State, ...]  # the state after each event (same length as events)


class PlanBuilder:
    def __init__(self, state: State) -> None:
        self.base = state
        self.state = state
        self.events: list[Event] = []
        self.states: list[State] = []

    def emit(self, event: Event) -> State:
        self.state = apply(self.state, event)
        self.events.append(event)
        self.states.append(self.state)
        return self.state

    def extend(self, plan: Plan[Any]) -> Any:
        """Adopt a sub-plan computed from this builder's current state."""
        if plan.base is not self.state:
            raise RuntimeError("sub-plan was computed from a different state")
        self.events.extend(plan.events)
        self.states.extend(plan.states)
        self.state = plan.state
        return plan.result

    def done(self, result: R) -> Plan[R]:
        return Plan(tuple(self.events), self.state, result, self.base, tuple(self.states))
