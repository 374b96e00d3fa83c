"""Shrinking a failing log to the few events that matter (delta debugging).

The failure to keep is a ``Signature``: its kind (``invariant``,
``invalid_event`` or ``fingerprint``) and its check (the invariant's name;
for a refused event the event type and the precondition with numbers
blanked out).  A candidate (the current events with some removed) is kept
only if replaying it fails with the same signature.  Passes, repeated until
nothing shrinks:

1. cut everything after the failing event;
2. drop whole request lifecycles (a request's events from its ``ReqAlloc``
   to its ``ReqFree``, with the request projected out of batched events);
3. ddmin over chunks (halves, quarters, ... down to single events);
4. shrink inside batched events (``Free`` pages, ``Evict``/``Touch`` nodes,
   ``Allocate``/``Append`` items, ``ReqAlloc``/``ReqFree`` requests): drop
   halves, quarters, ... down to single elements of one event.

A candidate is adopted when it is smaller: fewer events plus batch elements
(``log_weight``).

Removing events shifts the node ids the rules hand out, so every
candidate is *repaired* while it is replayed: node ids are renumbered to the
ids the rules expect, references to nodes that no longer exist are
dropped from ``Touch``/``Evict`` (and an event that is left empty goes).
What survives is replayed for real, so the output is always a valid log that
fails the same way.  Each candidate replays only from the first changed
event, starting from the cached state there (states are persistent, so the
cache costs little).  Pure apart from ``minimize_file``'s file I/O.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from kvstate.backends.persistent import apply_valid as apply
from kvstate.errors import InvalidEvent
from kvstate.events import Event
from kvstate.invariants import Violation, check
from kvstate.log.format import DEFAULT_CHECKPOINT_EVERY, Checkpoint, EndRecord, LogHeader
from kvstate.log.limits import DEFAULT_LIMITS, Limits
from kvstate.log.reader import LogReader
from kvstate.log.writer import LogWriter, make_header
from kvstate.replay.candidates import (
    Checker,
    Signature,
    batch_reductions,
    created_nodes,
    lifecycles,
    log_weight,
    project,
    refused_signature,
    replay_candidate,
)
from kvstate.replay.run import start_state
from kvstate.state import Geometry, State, initial_state

__all__ = ["MinimizeResult", "NoFailure", "Signature", "minimize_events", "minimize_file",
           "refused_signature"]


@attrs.frozen
class MinimizeResult:
    events: tuple[Event, ...]  # ends with the failing event
    signature: Signature
    original_events: int
    tests_run: int
    bad_fingerprint: bytes | None = None  # for fingerprint failures: the recorded checkpoint


class NoFailure(ValueError):
    """The log replays cleanly: there is nothing to minimize."""


# -- the search ------------------------------------------------------------------------
class _Search:
    def __init__(self, geometry: Geometry, events: Sequence[Event], checker: Checker,
                 max_tests: int, host_pages: int = 0,
                 progress: Callable[[int, int], None] | None = None) -> None:
        self.progress = progress  # (candidate replays so far, events now), after each replay
        self.geometry = geometry
        self.checker = checker
        self.max_tests = max_tests
        self.tests = 0
        outcome = replay_candidate(initial_state(geometry, host_pages=host_pages), events, set(),
                                   None, checker)
        if outcome.signature is None:
            raise NoFailure("the events replay without a failure; nothing to minimize")
        self.target: Signature = outcome.signature
        self.events: list[Event] = outcome.events
        self.states: list[State] = outcome.states  # states[i] = state before events[i]

    def attempt(self, first: int, candidate_suffix: Sequence[Event], dead: set[int]) -> bool:
        """Try ``events[:first] + candidate_suffix``; adopt it if it fails the same way."""
        if self.tests >= self.max_tests:
            return False
        self.tests += 1
        outcome = replay_candidate(self.states[first], candidate_suffix, dead, self.target,
                                    self.checker)
        if self.progress is not None:
            self.progress(self.tests, len(self.events))
        if outcome.signature != self.target:
            return False
        new_events = self.events[:first] + outcome.events
        if log_weight(new_events) >= log_weight(self.events):
            return False
        self.events = new_events
        self.states = self.states[:first] + outcome.states
        return True

    def drop_range(self, start: int, stop: int) -> bool:
        removed = self.events[start:stop]
        return self.attempt(start, self.events[stop:], created_nodes(removed))

    def lifecycles(self) -> bool:
        """Try dropping each request's whole lifecycle, latest first."""
        shrunk = False
        spans = lifecycles(self.events)
        position = len(spans) - 1
        while position >= 0 and self.tests < self.max_tests:
            request, start, stop = spans[position]
            events = self.events
            projected = project(events, request, start, stop, self.geometry.page_size)
            dead = created_nodes(events[start:stop + 1]) - created_nodes(projected[start:])
            if self.attempt(start, projected[start:], dead):
                shrunk = True
                spans = lifecycles(self.events)
                position = min(position, len(spans)) - 1
            else:
                position -= 1
        return shrunk

    def ddmin(self) -> bool:
        """Drop chunks from the end backwards, halving the chunk size down to single events."""
        shrunk = False
        size = max(1, (len(self.events) - 1) // 2)
        while self.tests < self.max_tests:
            removed_any = False
            stop = len(self.events) - 1  # the failing event itself is never dropped
            while stop > 0 and self.tests < self.max_tests:
                start = max(0, stop - size)
                if self.drop_range(start, stop):
                    removed_any = shrunk = True
                stop = start
            if removed_any:
                size = max(1, min(size, (len(self.events) - 1) // 2))
            elif size == 1:
                break
            else:
                size //= 2
        return shrunk


    def batches(self) -> bool:
        """Shrink batched events in place, latest first (the failing event included)."""
        shrunk = False
        index = len(self.events) - 1
        while index >= 0 and self.tests < self.max_tests:
            for smaller in batch_reductions(self.events[index], self.geometry.page_size):
                if self.attempt(index, [smaller, *self.events[index + 1:]], set()):
                    shrunk = True
                    break
            else:
                index -= 1
            index = min(index, len(self.events) - 1)
        return shrunk


def minimize_events(geometry: Geometry, events: Sequence[Event], *, checker: Checker | None = None,
                    max_tests: int = 20000, host_pages: int = 0,
                    progress: Callable[[int, int], None] | None = None) -> MinimizeResult:
    """Shrink ``events`` (which must fail) keeping the failure's kind and check."""
    search = _Search(geometry, events, checker or _full_check, max_tests, host_pages, progress)
    if search.target.kind == "invariant" and checker is None:
        name = search.target.check
        search.checker = lambda state: check(state, (name,))
    original = len(events)
    while True:
        before = log_weight(search.events)
        search.lifecycles()
        search.ddmin()
        search.batches()
        if log_weight(search.events) >= before or search.tests >= max_tests:
            break
    return MinimizeResult(tuple(search.events), search.target, original, search.tests)


def _full_check(state: State) -> list[Violation]:
    return check(state)


def read_failing_log(path: str | os.PathLike[str], limits: Limits = DEFAULT_LIMITS,
                     ) -> tuple[LogHeader, list[Event], Checkpoint | None]:
    """Events of a log up to its first bad checkpoint (returned) or its end (format errors raise,
    ``LogLimitError`` for a geometry beyond ``limits``)."""
    with LogReader(path, limits=limits) as reader:
        header = reader.header
        state = start_state(header)
        events: list[Event] = []
        for _, item in reader.records():
            if isinstance(item, Event):
                events.append(item)
                try:
                    state = apply(state, item)
                except InvalidEvent:
                    return header, events, None
            elif isinstance(item, (Checkpoint, EndRecord)) and item.fingerprint != state.fingerprint():
                return header, events, Checkpoint(len(events), item.fingerprint)
    return header, events, None


def minimize_file(source: str | os.PathLike[str], target: str | os.PathLike[str], *,
                  checker: Checker | None = None, max_tests: int = 20000,
                  checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
                  limits: Limits = DEFAULT_LIMITS,
                  progress: Callable[[int, int], None] | None = None) -> MinimizeResult:
    """Minimize the log at ``source`` and write the result to ``target``.

    A fingerprint mismatch cannot be shrunk (the recorded fingerprint belongs
    to the original events): the prefix up to the mismatching checkpoint is
    written, followed by that checkpoint.
    """
    header, events, bad = read_failing_log(source, limits)
    geometry, host_pages = header.geometry, header.host_pages
    meta: dict[str, Any] = {"minimized_from": os.path.basename(os.fspath(source))}
    if bad is not None:
        result = MinimizeResult(tuple(events), Signature("fingerprint", "checkpoint"), len(events), 0,
                                bad.fingerprint)
    else:
        result = minimize_events(geometry, events, checker=checker, max_tests=max_tests,
                                 host_pages=host_pages, progress=progress)
    meta["failure"] = {"kind": result.signature.kind, "check": result.signature.check}
    write_events_log(target, geometry, result.events, checkpoint_every=checkpoint_every, meta=meta,
                     bad_fingerprint=result.bad_fingerprint, host_pages=host_pages)
    return result


def write_events_log(path: str | os.PathLike[str], geometry: Geometry, events: Sequence[Event], *,
                     checkpoint_every: int, meta: dict[str, Any],
                     bad_fingerprint: bytes | None = None, host_pages: int = 0) -> None:
    """Write ``events`` with real checkpoints; a refused last event is written but not applied."""
    writer = LogWriter(path, make_header(geometry, checkpoint_every=checkpoint_every, meta=meta,
                                         host_pages=host_pages), fsync=False)
    state = initial_state(geometry, host_pages=host_pages)
    try:
        for evt in events:
            writer.write_event(evt)
            try:
                state = apply(state, evt)
            except InvalidEvent:
                break
            if checkpoint_every and writer.count % checkpoint_every == 0 and (
                    bad_fingerprint is None or writer.count != len(events)):
                writer.write_checkpoint(state.fingerprint())
        if bad_fingerprint is not None:
            writer.write_checkpoint(bad_fingerprint)
    except BaseException:
        writer.abandon()
        raise
    writer.close(state.fingerprint())
