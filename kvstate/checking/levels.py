"""The two search levels the explorer walks, behind one small interface.

A *level* says what a world is (the event level: a ``State``; the planner
level: a ``State`` plus the front end's request cursors), how to fingerprint
it, and how to expand it into ``Step``s.  Expanding runs every check that
belongs to an edge, so the explorer only adds the per-state checks, the
bookkeeping and the SOMETIMES probes.

Edge checks at the event level, for every candidate event:

* ``refines``: the rules and the spec model accept or reject it alike, and
  when both accept, ``abstract(after) == step(abstract(before), event)``;
* every ``specs.invariants.TRANSITIONS`` property.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import attrs

from kvstate import events as ev
from kvstate.backends.persistent import apply_valid as apply
from kvstate.checking.enabled import candidate_events
from kvstate.checking.scopes import Scope
from kvstate.checking.views import event_view, plain_view
from kvstate.errors import InvalidEvent
from kvstate.state import Geometry, State, initial_state


@attrs.frozen
class Step:
    label: str
    events: tuple[ev.Event, ...]
    world: Any  # None when the step was rejected or failed
    violations: tuple[tuple[str, str], ...] = ()


class Level(Protocol):
    scope: Scope

    def initial(self) -> Any: ...
    def state(self, world: Any) -> State: ...
    def view(self, world: Any) -> bytes: ...
    def expand(self, world: Any) -> Iterator[Step]: ...


def geometry_of(scope: Scope) -> Geometry:
    return Geometry(num_pages=scope.num_pages, page_size=scope.page_size,
                    num_rows=scope.num_rows, row_width=scope.num_pages * scope.page_size,
                    mode=scope.mode)


def check_refinement(before: State, event: ev.Event, after: State | None,
                     error: str | None, model_before: Any = None) -> list[tuple[str, str]]:
    """Agreement of the rules (``after``/``error``) with the spec model on one event.

    ``model_before`` may pass ``abstract(before)`` when the caller already has it.
    """
    from specs.abstraction import abstract_any, agrees_step, diff
    from specs.model import ModelReject, step_any

    if model_before is None:
        model_before = abstract_any(before)
    try:
        model_after = step_any(model_before, event)
    except ModelReject as exc:
        if after is None:
            return []
        return [("refines", f"rules accepted {event!r}, the spec rejects it: {exc}")]
    if after is None:
        return [("refines", f"rules rejected {event!r} ({error}), the spec accepts it")]
    if before.swa is None and before.mamba is None:
        agreed = agrees_step(before, model_before, after, model_after)
    else:  # a hybrid pool (specs.model_swa / model_mamba): compare the whole abstraction
        agreed = abstract_any(after) == model_after
    if not agreed:
        return [("refines", f"after {event!r} the rules and the spec differ in "
                            f"{diff(abstract_any(after), model_after)}")]
    return []


def edge_checks(before: State, event: ev.Event, after: State) -> list[tuple[str, str]]:
    from specs.invariants import check_edge

    return check_edge(before, event, after)


class EventLevel:
    """Worlds are ``State``s; steps are single candidate fact events."""

    def __init__(self, scope: Scope, *, check_model: bool = True, symmetry: bool | None = None):
        self.scope = scope
        self.check_model = check_model
        self.symmetry = scope.symmetry if symmetry is None else symmetry
        if self.symmetry and (scope.mode != "radix" or scope.host_pages):
            raise ValueError(f"scope {scope.name!r}: symmetry reduction is sound only for "
                             "radix scopes without a host tier")
        self.geometry = geometry_of(scope)

    def initial(self) -> State:
        return initial_state(self.geometry, host_pages=self.scope.host_pages,
                             swa_pages=self.scope.swa_pages, mamba_slots=self.scope.mamba_slots)

    def world_checks(self, world: State) -> list[tuple[str, str]]:
        """The hybrid pools' named invariants (``kvstate.invariants.swa`` / ``.mamba``)."""
        if world.swa is None and world.mamba is None:
            return []
        from kvstate.invariants import MAMBA_CHECKS, SWA_CHECKS, check

        names = (*(SWA_CHECKS if world.swa is not None else ()),
                 *(MAMBA_CHECKS if world.mamba is not None else ()))
        return [(v.check, v.message) for v in check(world, names)]

    def state(self, world: State) -> State:
        return world

    def view(self, world: State) -> bytes:
        return event_view(world) if self.symmetry else plain_view(world)

    def expand(self, world: State) -> Iterator[Step]:
        model_before = None
        if self.check_model:
            from specs.abstraction import abstract_any

            model_before = abstract_any(world)
        for event in candidate_events(world, self.scope):
            after, violations = self._one(world, event, model_before)
            if after is not None or violations:
                yield Step(type(event).__name__, (event,), after, tuple(violations))
        if world.swa is not None or world.mamba is not None:
            from kvstate.checking.enabled_hybrid import cascade_steps

            for events in cascade_steps(world, self.scope):
                step = self._compound(world, events, model_before)
                if step is not None:
                    yield step

    def _one(self, world: State, event: ev.Event,
             model_before: Any) -> tuple[State | None, list[tuple[str, str]]]:
        """The state after ``event`` (None: rejected) and the edge's violations."""
        try:
            after: State | None = apply(world, event)
            error = None
        except InvalidEvent as exc:
            after, error = None, exc.precondition
        violations: list[tuple[str, str]] = []
        if self.check_model:
            violations += check_refinement(world, event, after, error, model_before)
        if after is not None:
            violations += edge_checks(world, event, after)
        return after, violations

    def _compound(self, world: State, events: tuple[ev.Event, ...],
                  model_before: Any) -> Step | None:
        """One step of several events (each checked as its own edge); None when one of them
        is rejected (by the rules and the model alike)."""
        label = "+".join(type(e).__name__ for e in events)
        state: State | None = world
        for index, event in enumerate(events):
            assert state is not None
            if index and self.check_model:
                from specs.abstraction import abstract_any

                model_before = abstract_any(state)
            state, violations = self._one(state, event, model_before)
            if violations:
                return Step(label, events[: index + 1], state, tuple(violations))
            if state is None:
                return None
        return Step(label, events, state)
