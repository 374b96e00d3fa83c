"""``Listeners``: who follows an engine, and the protocol the engine calls them by.

A listener (a recorder, an executor, the request-table tensor) must define
``after(events, view)``, called once per committed batch after every event
of it was applied; a plain callable ``fn(event, view)`` is wrapped so that it
is called per event from there.  It may define ``before(event, view)``,
called before each event's rule (read-only; with ``before_events`` it is
called for those event types alone), and then also ``discard(event)``, for an
event that did not happen.  It may define ``rolled_back(events)``, for the
events of a batch the engine undid.

Failures: a listener whose ``after`` raises is detached and the first such
error is raised as ``ListenerError`` once every listener ran; one whose
``discard`` or ``rolled_back`` raises is detached with a note on the error
the engine is already raising.  While ``after`` hooks run, ``committing`` is
set, and the engine refuses to open a batch: a batch committed from there
would reach the listeners after it before the batch that caused it.

Owned by one ``Engine``; the engine reads ``befores`` directly on its hot path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvstate.errors import ListenerError
from kvstate.events import Event

Before = tuple[Any, frozenset[type] | None]  # (listener, the event types of its before, or all)


class _CallableListener:
    """Adapts ``fn(event, view)`` to the batch protocol."""

    def __init__(self, fn: Callable[[Event, Any], None]) -> None:
        self.fn = fn

    def after(self, events: Sequence[Event], view: Any) -> None:
        fn = self.fn
        for event in events:
            fn(event, view)

    def __repr__(self) -> str:
        return repr(self.fn)


class Listeners:
    """The listeners in subscription order, and those with a ``before`` hook."""

    __slots__ = ("all", "befores", "committing")

    def __init__(self) -> None:
        self.all: tuple[Any, ...] = ()  # replaced, never mutated: a commit iterates it
        self.befores: list[Before] = []  # replaced, never mutated, likewise
        self.committing = False

    def __contains__(self, listener: object) -> bool:
        return listener in self.all

    def subscribe(self, listener: Any) -> None:
        if not hasattr(listener, "after"):
            if not callable(listener):
                raise TypeError("a listener needs an after(events, view) method or must be callable")
            listener = _CallableListener(listener)
        self.all = (*self.all, listener)
        if hasattr(listener, "before"):
            kinds = getattr(listener, "before_events", None)
            self.befores = [*self.befores, (listener, None if kinds is None else frozenset(kinds))]

    def unsubscribe(self, listener: Any) -> None:
        for index, entry in enumerate(self.all):
            if entry is listener or getattr(entry, "fn", None) is listener:
                self.all = self.all[:index] + self.all[index + 1:]
                self.befores = [hook for hook in self.befores if hook[0] is not entry]
                return
        raise ValueError(f"{listener!r} is not subscribed")

    def discard(self, befores: Sequence[Before], event: Event, failure: BaseException) -> None:
        """Tell the listeners of ``befores`` that prepared for ``event`` that it did not
        happen (``failure``: the error the engine raises)."""
        kind = type(event)
        for listener, kinds in befores:
            if kinds is None or kind in kinds:
                try:
                    listener.discard(event)
                except Exception as exc:
                    self._detach(listener, "discard", exc, failure)

    def rolled_back(self, events: Sequence[Event], failure: BaseException) -> None:
        for listener in self.all:
            hook = getattr(listener, "rolled_back", None)
            if hook is not None:
                try:
                    hook(events)
                except Exception as exc:
                    self._detach(listener, "rolled_back", exc, failure)

    def after(self, events: Sequence[Event], view: Any) -> None:
        """Every listener's ``after``; the first failure raised once all ran."""
        failures: list[ListenerError] | None = None
        self.committing = True
        try:
            for listener in self.all:
                try:
                    listener.after(events, view)
                except Exception as exc:  # a failing listener is detached, the others still run
                    self.unsubscribe(listener)
                    failures = failures or []
                    failures.append(ListenerError(listener, exc))
        finally:
            self.committing = False
        if failures:
            raise failures[0]

    def _detach(self, listener: Any, hook: str, exc: Exception, failure: BaseException) -> None:
        if listener in self.all:
            self.unsubscribe(listener)
        failure.add_note(f"listener {listener!r} failed in {hook} ({exc!r}) and was detached")
