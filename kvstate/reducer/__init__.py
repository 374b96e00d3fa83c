"""The pure reducer: ``apply(state, event) -> state``.

Handlers live in small modules by concern (``rows``, ``pages``, ``tree``) and
register themselves with :func:`handles`.  A handler validates every
precondition before it builds anything, signals a violation by raising
``Reject`` and returns the new state; ``apply`` turns a ``Reject`` into
``InvalidEvent`` naming the event and its sequence number and bumps ``seq``
on success.  Nothing here mutates its inputs, and nothing here imports torch,
time, random or os.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from kvstate.errors import InvalidEvent
from kvstate.events import Event
from kvstate.state import State

E = TypeVar("E", bound=Event)
Handler = Callable[[State, E], State]

HANDLERS: dict[type[Event], Callable[[State, Event], State]] = {}


class Reject(Exception):
    """Raised by handlers for a violated precondition (message says which)."""


def handles(event_type: type[E]) -> Callable[[Handler[E]], Handler[E]]:
    def register(handler: Handler[E]) -> Handler[E]:
        HANDLERS[event_type] = handler  # type: ignore[assignment]
        return handler

    return register


def apply(state: State, event: Event) -> State:
    """Apply one event; raises ``InvalidEvent`` (state untouched) if it is not legal here."""
    handler = HANDLERS.get(type(event))
    if handler is None:
        raise InvalidEvent(event, state.seq, f"no reducer rule for {type(event).__name__}")
    try:
        new_state = handler(state, event)
    except Reject as exc:
        raise InvalidEvent(event, state.seq, str(exc)) from None
    if new_state is state:
        return state.with_changes(seq=state.seq + 1)
    # The handler built ``new_state`` just now and nobody else has seen it:
    # stamping its sequence number in place saves a second copy per event.
    object.__setattr__(new_state, "seq", state.seq + 1)
    return new_state


def apply_all(state: State, events: Iterable[Event]) -> State:
    """Fold ``apply`` over ``events``; stops at (and raises) the first invalid one."""
    for evt in events:
        state = apply(state, evt)
    return state


# Register the rules (imported for their side effect on HANDLERS).
from kvstate.reducer import block, host, pages, rows, tree  # noqa: E402,F401
