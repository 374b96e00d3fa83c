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
    def event_difference(self) -> str | None:
        """The first differing element of the first differing events (None: same events)."""
        if self.event_a is None or self.event_b is None:
            return None
        return event_difference(self.event_a, self.event_b)

    @property
    def identical(self) -> bool:
        return self.event_index is None and self.state_index is None

    def to_json(self) -> dict[str, Any]:
        return {"identical": self.identical, "events_a": self.events_a, "events_b": self.events_b,
                "event_index": self.event_index,
                "event_a": None if self.event_a is None else repr(self.event_a),
                "event_b": None if self.event_b is None else repr(self.event_b),
                "event_difference": self.event_difference,
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


def event_difference(a: Event, b: Event) -> str:
    """Where two events differ, down to the element: ``Allocate.pages[3]: 7 in A, 9 in B``."""
    if type(a) is not type(b):
        return f"event type: {type(a).__name__} in A, {type(b).__name__} in B"
    for name in a.__struct_fields__:
        found = _first_difference(getattr(a, name), getattr(b, name), f"{type(a).__name__}.{name}")
        if found is not None:
            return found
    return "the events are equal"


def _first_difference(x: Any, y: Any, path: str) -> str | None:
    if isinstance(x, tuple) and isinstance(y, tuple):
        for index, (xi, yi) in enumerate(zip(x, y, strict=False)):
            found = _first_difference(xi, yi, f"{path}[{index}]")
            if found is not None:
                return found
        if len(x) != len(y):
            longer, side = (x, "A") if len(x) > len(y) else (y, "B")
            extra = shorten(longer[min(len(x), len(y))], 80)
            return (f"{path}: {len(x)} elements in A, {len(y)} in B; {side} goes on with "
                    f"{extra} at [{min(len(x), len(y))}]")
        return None
    if x == y and type(x) is type(y):
        return None
    return f"{path}: {shorten(x, 80)} in A, {shorten(y, 80)} in B"


def focus(a: Any, b: Any, limit: int = 200) -> tuple[str, str]:
    """Both reprs cut to ``limit`` characters around where they first differ (``...`` marks a cut),
    so the differing element is always on screen."""
    ra, rb = repr(a), repr(b)
    common = 0
    for ca, cb in zip(ra, rb, strict=False):
        if ca != cb:
            break
        common += 1
    start = max(0, common - limit // 3)

    def cut(text: str) -> str:
        head = "..." if start > 0 else ""
        body = text[start: start + limit]
        tail = "..." if start + limit < len(text) else ""
        return head + body + tail

    return cut(ra), cut(rb)


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
