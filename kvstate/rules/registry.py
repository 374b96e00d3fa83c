"""The rule registry: ``RULES`` (one rule per event type), ``rule`` to add one, ``Reject``.

Its own module so that the rule modules import it without importing the
package that imports them.
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
