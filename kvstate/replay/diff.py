"""Comparing two logs: the first event where they diverge and the first state difference.

Both logs are replayed side by side from their own initial states.  The
first *event* divergence is the first index where the two events differ (or
one log ends); the first *state* difference is the first index after which
the two states' fingerprints differ, described down to the component
(free list, holders, a request's table, a tree node).  Streams both logs;
keeps only the two current states.

Up to the first event divergence the two states cannot differ (same initial
state, same events, deterministic rules), so that shared prefix is replayed
once, on the live backend, and no state is compared; states are compared
event by event only after the divergence.
This makes diffing two long logs that share most of their history cost about
one fast replay instead of two fingerprints per event.
"""

from __future__ import annotations

from itertools import zip_longest
from typing import Any

import attrs

from kvstate.backends.live import LiveState
from kvstate.backends.persistent import apply_valid
from kvstate.canonical import components
from kvstate.errors import InvalidEvent
from kvstate.events import Event
from kvstate.log.reader import LogReader
from kvstate.replay.run import start_state
from kvstate.state import State


@attrs.frozen
class LogDiff:
    """``event_index``: first differing event (None: same events); ``state_index``: first
    event after which the states differ (-1: the initial states; None: never)."""

    events_a: int
    events_b: int
    event_index: int | None
    event_a: Event | None
    event_b: Event | None
    state_index: int | None
    state_difference: str | None
    note: str | None = None  # e.g. one log's event was refused by the reducer

    @property
    def identical(self) -> bool:
        return self.event_index is None and self.state_index is None

    def to_json(self) -> dict[str, Any]:
        return {"identical": self.identical, "events_a": self.events_a, "events_b": self.events_b,
                "event_index": self.event_index,
                "event_a": None if self.event_a is None else repr(self.event_a),
                "event_b": None if self.event_b is None else repr(self.event_b),
                "state_index": self.state_index, "state_difference": self.state_difference,
                "note": self.note}


def describe_state_difference(a: State, b: State) -> str | None:
    """The first component where ``a`` and ``b`` differ, with the first differing entry."""
    for (name, va), (_, vb) in zip(components(a), components(b), strict=True):
        if va == vb:
            continue
        if isinstance(va, list) and isinstance(vb, list):
            for position, (xa, xb) in enumerate(zip_longest(va, vb)):
                if xa != xb:
                    return f"{name}: entry {position} is {shorten(xa)} in A, {shorten(xb)} in B"
        return f"{name}: {shorten(va)} in A, {shorten(vb)} in B"
    return None


def shorten(value: Any, limit: int = 160) -> str:
    """``repr(value)`` cut to ``limit`` characters (``(missing)`` for None)."""
    text = "(missing)" if value is None else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _step(state: State | None, evt: Event | None) -> tuple[State | None, str | None]:
    if state is None or evt is None:
        return state, None
    try:
        return apply_valid(state, evt), None
    except InvalidEvent as exc:
        return None, exc.precondition


def diff_logs(reader_a: LogReader, reader_b: LogReader) -> LogDiff:
    """Replay both logs side by side; raises ``LogFormatError`` if either is malformed."""
    start_a = start_state(reader_a.header)
    start_b = start_state(reader_b.header)
    state_a: State | None = start_a
    state_b: State | None = start_b
    event_index: int | None = None
    pair: tuple[Event | None, Event | None] = (None, None)
    state_index: int | None = None
    difference = describe_state_difference(start_a, start_b) if start_a != start_b else None
    if difference is not None:
        state_index = -1
    note = None
    count_a = count_b = 0
    # While the events agree, one replay stands for both (see the module docstring).
    shared = LiveState.thaw(start_a) if state_index is None else None
    for index, (evt_a, evt_b) in enumerate(zip_longest(reader_a.events(), reader_b.events())):
        count_a += evt_a is not None
        count_b += evt_b is not None
        if event_index is None and evt_a != evt_b:
            event_index, pair = index, (evt_a, evt_b)
        if state_index is not None:
            continue
        if shared is not None:
            if event_index is None:  # the same event on the same state
                try:
                    shared.apply(evt_a)  # type: ignore[arg-type]
                except InvalidEvent as exc:
                    state_index = index
                    note = difference = f"A's event refused: {exc.precondition}"
                continue
            state_a = state_b = shared.freeze()  # the divergence: compare from here on
            shared = None
        state_a, refused_a = _step(state_a, evt_a)
        state_b, refused_b = _step(state_b, evt_b)
        if refused_a or refused_b:
            state_index = index
            note = (f"A's event refused: {refused_a}" if refused_a else
                    f"B's event refused: {refused_b}")
            difference = note
        elif state_a is not None and state_b is not None and state_a != state_b:
            state_index = index
            difference = describe_state_difference(state_a, state_b)
    return LogDiff(count_a, count_b, event_index, pair[0], pair[1], state_index, difference, note)
