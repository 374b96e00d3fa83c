"""The event rules, each written once, for both backends.

A rule is ``rule(s, event) -> None``.  ``s`` is a *store*: the state's
containers opened for editing.  The persistent backend
(``kvstate.backends.persistent``) hands a rule a transaction over a frozen
``State`` and builds the next ``State`` from it; the live backend
(``kvstate.backends.live``) hands it the live engine's own containers.  Rules
see the same names either way (``kvstate.rules.store.Store``).

Every rule checks every precondition before its first write and signals a
violation by raising ``Reject`` (the backends turn it into ``InvalidEvent``
naming the event).  So a rejected event changes nothing on either backend.
Nothing here imports torch, time, random or os.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from kvstate.events import Event

E = TypeVar("E", bound=Event)
Rule = Callable[[Any, Any], None]

RULES: dict[type[Event], Rule] = {}


class Reject(Exception):
    """Raised by a rule for a violated precondition (the message says which)."""


def rule(event_type: type[E]) -> Callable[[Callable[[Any, E], None]], Callable[[Any, E], None]]:
    """Register the rule of ``event_type`` (one per type)."""

    def register(fn: Callable[[Any, E], None]) -> Callable[[Any, E], None]:
        if event_type in RULES:
            raise ValueError(f"{event_type.__name__} already has a rule")
        RULES[event_type] = fn
        return fn

    return register


# Register every rule (imported for their side effect on RULES).
from kvstate.rules import block, frees, host, pages, rows, tree  # noqa: E402,F401
