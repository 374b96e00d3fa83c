"""Candidate operations for delta debugging: failure signatures, node-id repair, lifecycles.

A candidate is the current event list with some events removed or a
request projected out.  ``replay_candidate`` replays it from a cached state
and *repairs* it on the way: node ids are renumbered to what the rules
hands out, references to nodes that no longer exist are dropped from
``Touch``/``Evict`` (an event left empty goes), and the first failure is
reported as a ``Signature``.  Pure: every function returns new values.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import attrs
from msgspec.structs import replace as evolve_event

from kvstate.backends.persistent import apply_valid as apply
from kvstate.errors import InvalidEvent
from kvstate.events import (
    Allocate,
    Append,
    Assign,
    Event,
    Evict,
    Free,
    Insert,
    Lock,
    ReqAlloc,
    ReqFree,
    Share,
    Split,
    Touch,
    Truncate,
    Unlock,
)
from kvstate.invariants import Violation
from kvstate.state import ROOT, State

Checker = Callable[[State], list[Violation]]
_NUMBER = re.compile(r"-?\d+")


@attrs.frozen
class Signature:
    kind: str
    check: str

    def __str__(self) -> str:
        return f"{self.kind} [{self.check}]"


def refused_signature(evt: Event, precondition: str) -> Signature:
    return Signature("invalid_event", f"{type(evt).__name__}: {_NUMBER.sub('#', precondition)}")


# -- candidate replay with node-id repair ---------------------------------------------
@attrs.define
class Outcome:
    signature: Signature | None
    events: list[Event]  # repaired events, through the failing one
    states: list[State]  # states before each repaired event (and one after the last applied)


def remap(evt: Event, state: State, ids: dict[int, int | None]) -> Event | None:
    """Rewrite node ids in ``evt`` for the candidate's state; None drops the event."""
    def live(node: int) -> int | None:
        new = ids.get(node, node)
        return new if new is not None and (new == ROOT or new in state.nodes) else None

    if isinstance(evt, Insert):
        parent = live(evt.parent)
        if parent is None:
            return None
        ids[evt.node] = state.next_node_id
        return evolve_event(evt, parent=parent, node=state.next_node_id)
    if isinstance(evt, Split):
        node = live(evt.node)
        if node is None:
            return None
        ids[evt.new_node] = state.next_node_id
        return evolve_event(evt, node=node, new_node=state.next_node_id)
    if isinstance(evt, (Touch, Evict)):
        nodes = [n for n in (live(n) for n in evt.nodes) if n is not None]
        if not nodes:
            return None
        return evolve_event(evt, nodes=tuple(nodes))
    if isinstance(evt, (Lock, Unlock)):
        node = live(evt.node)
        return None if node is None else type(evt)(node)
    return evt


def replay_candidate(start: State, events: Sequence[Event], dead: set[int],
                      target: Signature | None, checker: Checker) -> Outcome:
    """Replay ``events`` from ``start`` until the first failure (repairing node ids)."""
    ids: dict[int, int | None] = dict.fromkeys(dead)
    state = start
    out: list[Event] = []
    states: list[State] = []
    for original in events:
        evt = remap(original, state, ids)
        if evt is None:
            continue
        states.append(state)
        out.append(evt)
        try:
            state = apply(state, evt)
        except InvalidEvent as exc:
            return Outcome(refused_signature(evt, exc.precondition), out, states)
        violations = checker(state)
        if violations:
            states.append(state)
            return Outcome(Signature("invariant", violations[0].check), out, states)
    states.append(state)
    return Outcome(None, out, states)


def created_nodes(events: Sequence[Event]) -> set[int]:
    created = set()
    for evt in events:
        if isinstance(evt, Insert):
            created.add(evt.node)
        elif isinstance(evt, Split):
            created.add(evt.new_node)
    return created


# -- request lifecycles ---------------------------------------------------------------
def lifecycles(events: Sequence[Event]) -> list[tuple[Any, int, int]]:
    """``(request, first index, last index)`` from each ReqAlloc to its ReqFree (or the end)."""
    open_at: dict[Any, int] = {}
    spans = []
    for index, evt in enumerate(events):
        if isinstance(evt, ReqAlloc):
            for request in evt.requests:
                open_at[request] = index
        elif isinstance(evt, ReqFree):
            for request in evt.requests:
                if request in open_at:
                    spans.append((request, open_at.pop(request), index))
    spans.extend((request, start, len(events) - 1) for request, start in open_at.items())
    return sorted(spans, key=lambda span: span[1])


def _without_request(evt: Event, request: Any) -> Event | None:
    """``evt`` with ``request`` projected out; None when nothing is left."""
    if isinstance(evt, (ReqAlloc, ReqFree)):
        rest = tuple(r for r in evt.requests if r != request)
        return type(evt)(rest) if rest else None
    if isinstance(evt, (Assign, Share, Truncate)):
        return None if evt.request == request else evt
    if isinstance(evt, Append):
        items = tuple(item for item in evt.items if item[0] != request)
        return Append(items) if items else None
    return evt


def project(events: Sequence[Event], request: Any, start: int, stop: int,
             page_size: int) -> list[Event]:
    out = list(events[:start])
    for evt in events[start:stop + 1]:
        if isinstance(evt, Allocate) and evt.items and any(i[0] == request for i in evt.items):
            kept = [index for index, item in enumerate(evt.items) if item[0] != request]
            if kept:
                out.append(_keep(evt, kept, page_size))
            continue
        projected = _without_request(evt, request)
        if projected is not None:
            out.append(projected)
    out.extend(events[stop + 1:])
    return out


# -- shrinking inside batched events ----------------------------------------------------
def batch_size(evt: Event) -> int:
    """How many elements a batched event carries (1 for an event that is not batched)."""
    if isinstance(evt, (ReqAlloc, ReqFree)):
        return len(evt.requests)
    if isinstance(evt, Allocate):
        # items name the requests the pages go to; without items (a detached
        # allocation) the pages themselves are the batch
        return len(evt.items) if evt.items else len(evt.pages)
    if isinstance(evt, Append):
        return len(evt.items)
    if isinstance(evt, Free):
        return len(evt.pages)
    if isinstance(evt, (Touch, Evict)):
        return len(evt.nodes)
    return 1


def log_weight(events: Sequence[Event]) -> int:
    """The size the minimizer shrinks: one per event plus one per extra batch element."""
    return sum(batch_size(evt) for evt in events)


def _keep(evt: Event, kept: list[int], page_size: int) -> Event:
    """``evt`` with only the batch elements at positions ``kept``."""
    if isinstance(evt, (ReqAlloc, ReqFree)):
        return type(evt)(tuple(evt.requests[i] for i in kept))
    if isinstance(evt, Append):
        return Append(tuple(evt.items[i] for i in kept))
    if isinstance(evt, Free):
        return evolve_event(evt, pages=tuple(evt.pages[i] for i in kept))
    if isinstance(evt, (Touch, Evict)):
        return evolve_event(evt, nodes=tuple(evt.nodes[i] for i in kept))
    assert isinstance(evt, Allocate)
    if not evt.items:
        return Allocate(tuple(evt.pages[i] for i in kept))
    items = tuple(evt.items[i] for i in kept)
    # drop the pages only the dropped items start (a page no item uses stays, as it was)
    theirs = {slot // page_size for _, slots in items for slot in slots}
    keep = set(kept)
    dropped = {slot // page_size for i, (_, slots) in enumerate(evt.items) if i not in keep
               for slot in slots}
    return Allocate(tuple(p for p in evt.pages if p not in dropped or p in theirs), items)


def batch_reductions(evt: Event, page_size: int) -> list[Event]:
    """Smaller versions of a batched event, largest cuts first (ddmin inside one event).

    Halves, then quarters, ... down to dropping single elements.  Each
    reduction keeps at least one element; dropping the whole event is the
    chunk pass's job.  An ``Allocate`` loses the pages only its dropped items
    used.
    """
    count = batch_size(evt)
    if count < 2:
        return []
    out: list[Event] = []
    chunk = count // 2
    while chunk >= 1:
        for start in range(0, count, chunk):
            kept = [i for i in range(count) if not start <= i < start + chunk]
            if kept:
                out.append(_keep(evt, kept, page_size))
        chunk //= 2
    return out
