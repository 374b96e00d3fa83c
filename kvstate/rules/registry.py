"""The rule registry: ``RULES`` (one rule per event type), ``RULE_MODES``, ``rules_for``,
``rule``, ``Reject``.

Its own module so that the rule modules import it without importing the
package that imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from kvstate.events import Event

E = TypeVar("E", bound=Event)
Rule = Callable[[Any, Any], None]

# The geometry modes each event type applies in: radix events (SGLang's pools and
# tree, the host tier, the hybrids) never touch a block-mode state, whose tree holds
# nothing, and block events never touch a radix one.
RULE_MODES: dict[type[Event], frozenset[str]] = {}
# mode -> the rules that apply in it: a backend finds an event's rule and its mode check in
# one lookup.  Kept in step with ``RULES`` by ``_RuleTable``.
RULES_BY_MODE: dict[str, dict[type[Event], Rule]] = {}


class _RuleTable(dict[type[Event], Rule]):
    """``RULES``: setting or deleting an entry (a test swapping in a broken rule, as the
    canaries do) also updates ``RULES_BY_MODE``, so both backends run what ``RULES`` says."""

    def __setitem__(self, event_type: type[Event], fn: Rule) -> None:
        super().__setitem__(event_type, fn)
        for mode in RULE_MODES[event_type]:
            rules_for(mode)[event_type] = fn

    def __delitem__(self, event_type: type[Event]) -> None:
        super().__delitem__(event_type)
        for table in RULES_BY_MODE.values():
            table.pop(event_type, None)


RULES: dict[type[Event], Rule] = _RuleTable()


def rules_for(mode: str) -> dict[type[Event], Rule]:
    """The rules of geometry ``mode`` (a live table: it follows later changes to ``RULES``)."""
    return RULES_BY_MODE.setdefault(mode, {})


class Reject(Exception):
    """Raised by a rule for a violated precondition (the message says which)."""


def rule(event_type: type[E], modes: tuple[str, ...] = ("radix",)
         ) -> Callable[[Callable[[Any, E], None]], Callable[[Any, E], None]]:
    """Register the rule of ``event_type`` (one per type), for states of ``modes``."""

    def register(fn: Callable[[Any, E], None]) -> Callable[[Any, E], None]:
        if event_type in RULES:
            raise ValueError(f"{event_type.__name__} already has a rule")
        RULE_MODES[event_type] = frozenset(modes)
        RULES[event_type] = fn
        return fn

    return register


def refusal(event_type: type[Event], mode: str) -> str:
    """Why ``event_type`` has no rule on a state of geometry ``mode``."""
    if event_type not in RULES:
        return f"no rule for {event_type.__name__}"
    wanted = " or ".join(sorted(RULE_MODES[event_type]))
    return f"{event_type.__name__} needs a {wanted}-mode geometry (mode={mode!r})"
