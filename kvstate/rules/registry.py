"""The rule registry: ``RULES`` (one rule per event type), ``RULE_MODES``, ``rule``, ``Reject``.

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
# The geometry modes each event type applies in: radix events (SGLang's pools and
# tree, the host tier, the hybrids) never touch a block-mode state, whose tree holds
# nothing, and block events never touch a radix one.
RULE_MODES: dict[type[Event], frozenset[str]] = {}


class Reject(Exception):
    """Raised by a rule for a violated precondition (the message says which)."""


def rule(event_type: type[E], modes: tuple[str, ...] = ("radix",)
         ) -> Callable[[Callable[[Any, E], None]], Callable[[Any, E], None]]:
    """Register the rule of ``event_type`` (one per type), for states of ``modes``."""

    def register(fn: Callable[[Any, E], None]) -> Callable[[Any, E], None]:
        if event_type in RULES:
            raise ValueError(f"{event_type.__name__} already has a rule")
        RULES[event_type] = fn
        RULE_MODES[event_type] = frozenset(modes)
        return fn

    return register


def wrong_mode(event_type: type[Event], mode: str) -> str:
    """Why ``event_type`` is refused on a state of geometry ``mode``."""
    wanted = " or ".join(sorted(RULE_MODES[event_type]))
    return f"{event_type.__name__} needs a {wanted}-mode geometry (mode={mode!r})"
