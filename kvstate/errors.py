"""Typed errors shared across kvstate.

Every rejection the library makes is one of these, so callers can tell a bad
event (``InvalidEvent``) from exhausted memory (``OutOfMemory``) from a
malformed log (defined next to the log reader).  All are ``ValueError``s
except ``OutOfMemory``, which is a ``MemoryError``: it reports a capacity
condition, not a mistake by the caller.  The engine's own failures follow:
a batch it could not roll back (``EngineBroken``), a listener that failed at
a commit (``ListenerError``) and a backend disagreement (``VerificationError``).
"""

from __future__ import annotations

from typing import Any


class InvalidEvent(ValueError):
    """The reducer rejected an event; the state it was applied to is unchanged.

    Attributes name the event, its sequence number in the state's history and
    the violated precondition, so a replayed log can point at the exact record.
    """

    def __init__(self, event: Any, seq: int, precondition: str) -> None:
        self.event = event
        self.seq = seq
        self.precondition = precondition
        super().__init__(f"event #{seq} {event!r} rejected: {precondition}")


class OutOfMemory(MemoryError):
    """An allocation could not be satisfied even after allowed eviction.

    ``needed`` and ``available`` are in the unit named by ``unit`` (tokens or
    pages).  Raising it never changes state: the planner computes everything
    before a single event is applied.
    """

    def __init__(self, needed: int, available: int, unit: str = "tokens") -> None:
        self.needed = needed
        self.available = available
        self.unit = unit
        super().__init__(f"out of memory: need {needed} {unit}, only {available} available")


class EngineBroken(RuntimeError):
    """A batch failed after it had changed the live state and could not be rolled back.

    Only a planner bug can cause this (a planner's later event refused by the
    rules); the engine refuses further use rather than go on from a state no
    event sequence explains.
    """


class VerificationError(AssertionError):
    """The live backend and the persistent backend disagree (``verify_every``)."""

    def __init__(self, index: int, event: Any, message: str) -> None:
        self.index = index
        self.event = event
        super().__init__(f"event #{index} {event!r}: {message}")


class ListenerError(RuntimeError):
    """A listener raised while a committed batch was delivered; the batch stays applied."""

    def __init__(self, listener: Any, error: BaseException) -> None:
        self.listener = listener
        self.error = error
        super().__init__(f"listener {listener!r} failed and was detached: {error!r}")
