"""Builders: where a planner emits the events of a decision.

A planner function takes a builder ``b`` and reads ``b.state`` (the state
as it is after the events emitted so far), decides, and calls ``b.emit``.
Two builders exist:

* ``PlanBuilder(state)`` (here): persistent and standalone; ``done(result)``
  gives a ``Plan`` (events, final state, result, base).  The explorer, the
  spec checks and tests use it.
* ``kvstate.engine.Batch``: the engine's open batch; the live front ends
  use it, and the engine's listeners see the events when the batch ends.

A planner never emits an event it has not checked it can (a ``None``
decision emits nothing), so a batch the planner built is applied whole.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

import attrs

from kvstate.backends.persistent import apply_valid
from kvstate.events import Event
from kvstate.state import State

R = TypeVar("R")


class Builder(Protocol):
    """What a planner needs: the current state and a way to emit an event."""

    @property
    def state(self) -> Any: ...
    def emit(self, event: Event) -> None: ...


@attrs.frozen
class Plan(Generic[R]):
    """Events of a decision, the state after them, the decision's result and the base state."""

    events: tuple[Event, ...]
    state: State
    result: R
    base: State


class PlanBuilder:
    """Applies each emitted event with the persistent backend (scratch: mutates itself only)."""

    def __init__(self, state: State) -> None:
        self.base = state
        self.state = state
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.state = apply_valid(self.state, event)
        self.events.append(event)

    def done(self, result: R) -> Plan[R]:
        return Plan(tuple(self.events), self.state, result, self.base)
