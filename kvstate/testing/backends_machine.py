"""``BackendsMachine``: the choke point every spec state machine steps through.

Owned by the checking tools (``kvstate.testing``).  :meth:`BackendsMachine.step`
applies an event through the persistent backend (the overridable
:meth:`apply_event`), through a ``LiveState`` (the engine's backend, in
place) and to ``specs.model``.  All three must accept or all reject; a
rejected event must leave the live state's fingerprint as it was; after an
accepted step the two backends' fingerprints are equal and every
TRANSITIONS property holds on the edge, and after every rule
``abstract(state) == model`` for both backends and every ALWAYS property
holds.  Backend disagreements fail as ``backends``, model disagreements as
``refines``.  On a failure the events so far are written to
``replay/failures/<MachineName>.msgpack`` (each failing run overwrites it,
so it ends up holding hypothesis's shrunk example).  Subclasses add the
rules: ``SpecMachine`` (radix), ``BlockSpecMachine`` and ``HostSpecMachine``
(``kvstate.testing.machines``).  A machine owns and mutates only its own
attributes.
"""

from __future__ import annotations

import pathlib
from typing import Any

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvstate import events as ev
from kvstate.backends.live import LiveState
from kvstate.backends.persistent import apply_valid as apply
from kvstate.checking.enabled import candidate_events
from kvstate.checking.scopes import Scope
from kvstate.errors import InvalidEvent
from kvstate.state import State


class BackendsMachine(RuleBasedStateMachine):
    log_dir = "replay/failures"
    check_model = True  # False: check only the registered properties (canaries use this)
    state: State
    live: LiveState
    model: Any
    log: list[ev.Event]
    event_scope: Scope

    # -- the choke point ---------------------------------------------------------------
    def apply_event(self, state: State, event: ev.Event) -> State:
        """The implementation under test (the persistent backend by default)."""
        return apply(state, event)

    def step(self, event: ev.Event) -> bool:
        """Apply ``event`` to both backends and the model; True if accepted.  Fails loudly
        on any disagreement."""
        from specs.invariants import check_edge
        from specs.model import ModelReject
        from specs.model import step as model_step

        note(f"event {ev.event_record(event)}")
        try:
            after: State | None = self.apply_event(self.state, event)
            error = ""
        except InvalidEvent as exc:
            after, error = None, exc.precondition
        self._follow_live(event, after, error)
        if not self.check_model:
            model_after, model_error = (None if after is None else self.model), ""
        else:
            try:
                model_after = model_step(self.model, event)
                model_error = ""
            except ModelReject as exc:
                model_after, model_error = None, str(exc)
        if (after is None) != (model_after is None):
            reducer = "rejected: " + error if after is None else "accepted"
            spec = "rejected: " + model_error if model_after is None else "accepted"
            self.fail([event], "refines", f"rules {reducer}; spec {spec}")
        if after is None:
            return False
        found = check_edge(self.state, event, after)
        if found:
            self.fail([event], found[0][0], found[0][1])
        self.log.append(event)
        self.state, self.model = after, model_after
        return True

    def _follow_live(self, event: ev.Event, after: State | None, error: str) -> None:
        """The live backend applies ``event`` in place and must end where the persistent one
        did (or, on a rejection, where it started, with the same error)."""
        before = self.live.fingerprint()
        try:
            self.live.apply(event)
            live_error = None
        except InvalidEvent as exc:
            live_error = exc.precondition
        if (after is None) != (live_error is not None):
            persistent = "rejected: " + error if after is None else "accepted"
            live = "rejected: " + str(live_error) if live_error is not None else "accepted"
            self.fail([event], "backends", f"persistent {persistent}; live {live}")
        if after is None:
            if self.live.fingerprint() != before:
                self.fail([event], "backends", f"the live backend rejected {event!r} but changed")
        elif self.live.fingerprint() != after.fingerprint():
            self.fail([event], "backends", f"after {event!r} the backends' fingerprints differ")

    def fail(self, extra: list[ev.Event], name: str, message: str) -> None:
        from kvstate.checking.counterexample import write_event_log

        path = pathlib.Path(self.log_dir) / f"{type(self).__name__}.msgpack"
        host_pages = 0 if self.state.host is None else self.state.host.num_pages
        write_event_log(path, self.state.geometry, self.log + extra, [name],
                        origin="hypothesis", note=message, host_pages=host_pages)
        raise AssertionError(f"[{name}] {message} (log: {path})")

    # -- configuration -----------------------------------------------------------------
    def start(self, scope: Any, state: State, event_scope: Scope) -> None:
        """Begin from ``state`` on both backends; ``event_scope`` drives ``any_fact``."""
        from specs.abstraction import abstract

        self.scope = scope
        self.state = state
        self.live = LiveState.thaw(state)
        self.model = abstract(state)
        self.log = []
        self.event_scope = event_scope


    @rule(data=st.data())
    def any_fact(self, data: st.DataObject) -> None:
        """Any candidate fact event the explorer would try here (legal or not)."""
        events = list(candidate_events(self.state, self.event_scope))
        if events:
            self.step(data.draw(st.sampled_from(events), label="event"))

    # -- after every rule ------------------------------------------------------------------
    @invariant()
    def agrees_with_spec(self) -> None:
        from specs.abstraction import abstract, diff
        from specs.invariants import check_state

        if not hasattr(self, "state"):
            return
        for side, state in (("persistent", self.state), ("live", self.live)):
            got = abstract(state)
            if self.check_model and got != self.model:
                self.fail([], "refines", f"{side} backend and spec differ in {diff(got, self.model)}")
            found = check_state(state)
            if found:
                self.fail([], found[0][0], f"{found[0][1]} ({side} backend)")


__all__ = ["BackendsMachine"]
