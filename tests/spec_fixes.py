"""Proposed reducer fixes for the findings of the spec (see specs/SPEC.md, "Findings").

Until the core adopts them, the explorer and stateful tests run with these
wrappers installed around ``kvstate.reducer.HANDLERS`` (each adds one
precondition and otherwise defers to the core rule).  ``FINDINGS`` holds the
exact event sequences; ``tests/test_spec_findings.py`` asserts the *core*
rejects each final event (xfail until fixed).  Once the core rejects all of
them, ``install`` becomes a no-op and this module can be deleted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from kvstate import events as ev
from kvstate.errors import InvalidEvent
from kvstate.reducer import HANDLERS, Reject, apply
from kvstate.state import Geometry, State, initial_state

Handler = Callable[[State, ev.Event], State]

# name -> (geometry, events; the last one must be rejected)
FINDINGS: dict[str, tuple[Geometry, list[ev.Event]]] = {
    "F1-evict-mapped-tree-page": (Geometry(2, 1, 2, 2), [
        ev.ReqAlloc((1,)), ev.Allocate((1,), ((1, (1,)),)),
        ev.Insert(0, (1,), (1,), 1, 1, 1), ev.Evict((1,), False)]),
    "F2-reset-tree-under-mapped-page": (Geometry(2, 1, 2, 2), [
        ev.ReqAlloc((1,)), ev.Allocate((1,), ((1, (1,)),)),
        ev.Insert(0, (1,), (1,), 1, 1, 1), ev.Reset("tree")]),
    "F3-append-into-shared-page": (Geometry(2, 2, 2, 4), [
        ev.ReqAlloc((1,)), ev.ReqAlloc((2,)), ev.Allocate((1,), ((1, (2,)),)),
        ev.Share(2, 0, (2, 3)), ev.Allocate((), ((1, (3,)),))]),
    "F4-unlock-ancestor-without-own-lock": (Geometry(2, 1, 2, 2), [
        ev.Allocate((1,)), ev.Allocate((2,)), ev.Insert(0, (1,), (1,), 1, 1, 0),
        ev.Insert(1, (1,), (2,), 2, 2, 0), ev.Lock(2), ev.Unlock(1)]),
    "F5-share-page-already-in-table": (Geometry(2, 1, 2, 2), [
        ev.ReqAlloc((1,)), ev.Allocate((1,), ((1, (1,)),)),
        ev.Insert(0, (1,), (1,), 1, 1, 1), ev.Share(1, 1, (1,))]),
}


def core_rejects(name: str) -> bool:
    geometry, events = FINDINGS[name]
    state = apply_prefix = initial_state(geometry)
    for event in events[:-1]:
        apply_prefix = apply(apply_prefix, event)
    state = apply_prefix
    try:
        apply(state, events[-1])
    except InvalidEvent:
        return True
    return False


def _mapped_tree_pages(state: State) -> set[int]:
    return {p for rid, r in state.requests.items() for p in r.pages
            if p in state.page_node and rid not in state.holders.get(p, ())}


def _wrap(core: dict[type[ev.Event], Handler]) -> dict[type[ev.Event], Handler]:
    def evict(state: State, e: ev.Event) -> State:
        assert isinstance(e, ev.Evict)
        mapped = _mapped_tree_pages(state)
        for node_id in e.nodes:
            node = state.nodes.get(node_id)
            if node is not None and mapped & set(node.pages):
                raise Reject(f"node {node_id} has pages a request maps (use after free)")
        return core[ev.Evict](state, e)

    def reset(state: State, e: ev.Event) -> State:
        assert isinstance(e, ev.Reset)
        if e.scope == "tree" and _mapped_tree_pages(state):
            raise Reject("a request maps tree pages it does not hold")
        return core[ev.Reset](state, e)

    def injective(event_type: type[ev.Event]) -> Handler:
        def rule(state: State, e: ev.Event) -> State:
            out = core[event_type](state, e)
            pages = list(out.requests[e.request].pages)  # type: ignore[attr-defined]
            if len(pages) != len(set(pages)):
                raise Reject("a table would map one page at two page indices")
            return out
        return rule

    def allocate(state: State, e: ev.Event) -> State:
        assert isinstance(e, ev.Allocate)
        size = state.geometry.page_size
        for rid, slots in e.items:
            record = state.requests.get(rid)
            if record is not None and slots and record.allocated % size:
                page = record.pages[-1]
                if state.holders.get(page) != (rid,) or page in state.page_node:
                    raise Reject(f"partial page {page} is shared; appends need it alone")
        return core[ev.Allocate](state, e)

    def unlock(state: State, e: ev.Event) -> State:
        assert isinstance(e, ev.Unlock)
        node = state.nodes.get(e.node)
        if node is not None and e.node != 0:
            below = sum(state.nodes[c].lock_ref for c in node.children.values())
            if node.lock_ref - below <= 0:
                raise Reject(f"node {e.node} holds no lock of its own")
        return core[ev.Unlock](state, e)

    return {ev.Evict: evict, ev.Reset: reset, ev.Assign: injective(ev.Assign),
            ev.Share: injective(ev.Share), ev.Allocate: allocate, ev.Unlock: unlock}


def needed() -> bool:
    return not all(core_rejects(name) for name in FINDINGS)


def install() -> Callable[[], None]:
    """Install the wrappers (if any finding is still open); returns an undo function."""
    saved = dict(HANDLERS)
    if needed():
        HANDLERS.update(_wrap(saved))

    def undo() -> None:
        HANDLERS.clear()
        HANDLERS.update(saved)

    return undo


@contextmanager
def proposed_fixes() -> Iterator[None]:
    undo = install()
    try:
        yield
    finally:
        undo()
