"""``Engine``: the one mutable cell around the immutable core.

An engine owns the current ``State`` and the list of events applied so far.
Front ends (the SGLang objects, the seed-002 manager, the vLLM classes)
share one engine; every change goes through :meth:`apply` or
:meth:`commit`, which notify subscribers (a log recorder, a torch executor)
after the state has moved.  ``apply`` either applies an event or raises
``InvalidEvent`` and leaves everything as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kvstate.events import Event
from kvstate.planner.builder import Plan
from kvstate.reducer import apply as reduce
from kvstate.state import Geometry, State, initial_state

R = TypeVar("R")
Listener = Callable[[Event, State], None]


class Engine:
    """Holds ``state`` and ``events``; mutates only through ``apply``/``commit``/``configure``."""

    def __init__(self, geometry: Geometry | None = None, *, state: State | None = None,
                 keep_events: bool = True) -> None:
        if state is None:
            state = initial_state(geometry if geometry is not None else Geometry(num_pages=1))
        self._state = state
        self._initial = state
        self._events: list[Event] = []
        self._keep_events = keep_events
        self._listeners: list[Listener] = []

    @property
    def state(self) -> State:
        return self._state

    @property
    def initial_state(self) -> State:
        return self._initial

    @property
    def events(self) -> Sequence[Event]:
        """Events applied so far (a read-only tuple copy)."""
        return tuple(self._events)

    @property
    def geometry(self) -> Geometry:
        return self._state.geometry

    def configure(self, **changes: Any) -> None:
        """Change the geometry of a fresh engine (before any event was applied)."""
        if self._state.seq != 0:
            raise RuntimeError("an engine's geometry is fixed once events were applied")
        geometry = Geometry(**{**_geometry_fields(self._state.geometry), **changes})
        self._state = self._initial = initial_state(geometry)

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(event, state_after)`` after every applied event."""
        self._listeners.append(listener)

    def unsubscribe(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def apply(self, event: Event) -> State:
        self._state = reduce(self._state, event)
        self._record(event, self._state)
        return self._state

    def commit(self, plan: Plan[R]) -> R:
        """Adopt a plan computed from the current state (its events are already validated)."""
        if plan.base is not self._state:
            raise RuntimeError("plan was computed from a different state than the engine's")
        if plan.events:
            if self._listeners:
                # Listeners see the state after each event (the plan kept them all).
                for event, state in zip(plan.events, plan.states, strict=True):
                    self._state = state
                    self._record(event, state)
                return plan.result
            if self._keep_events:
                self._events.extend(plan.events)
        self._state = plan.state
        return plan.result

    def _record(self, event: Event, state: State) -> None:
        if self._keep_events:
            self._events.append(event)
        for listener in self._listeners:
            listener(event, state)


def _geometry_fields(geometry: Geometry) -> dict[str, Any]:
    return {
        "num_pages": geometry.num_pages,
        "page_size": geometry.page_size,
        "num_rows": geometry.num_rows,
        "row_width": geometry.row_width,
        "mode": geometry.mode,
    }
