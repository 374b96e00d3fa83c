"""Named properties of the kvstate core, in three registries.

* ``ALWAYS[name](state) -> list[str]``: must hold in every reachable state.
* ``TRANSITIONS[name](before, event, after) -> list[str]``: must hold on every
  edge the reducer accepts (TLC's implied actions; checked even when ``after``
  was seen before).
* ``SOMETIMES[name](edge) -> bool``: must be witnessed at least once by a
  checking run (non-vacuity: a scope or a test that never reaches it is too
  weak to mean anything).

Every function is pure and returns one message per violated fact.  Ids and
meanings are listed in ``specs/SPEC.md``.  The ALWAYS checks reuse the core's
named checks (``kvstate.invariants.CHECKS``) and add the spec's own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import attrs

from kvstate import events as ev
from kvstate.invariants import CHECKS
from kvstate.state import DETACHED, ROOT, State

StateCheck = Callable[[State], list[str]]
EdgeCheck = Callable[[State, ev.Event, State], list[str]]


@attrs.frozen
class Edge:
    """What a SOMETIMES probe sees: one step (one event, or one planner command)."""

    before: State
    events: tuple[ev.Event, ...]
    after: State
    previous: tuple[ev.Event, ...] = ()  # the events of the step that led to ``before``


# -- ALWAYS --------------------------------------------------------------------------
ALWAYS: dict[str, StateCheck] = {}
for _name, _fn in CHECKS.items():
    ALWAYS[_name] = (lambda fn: lambda state: list(fn(state)))(_fn)


def _always(name: str) -> Callable[[StateCheck], StateCheck]:
    def register(fn: StateCheck) -> StateCheck:
        ALWAYS[name] = fn
        return fn

    return register


@_always("table_injective")
def _table_injective(state: State) -> list[str]:
    """No table maps one page at two page indices (two positions would share a slot)."""
    out = []
    block_mode = state.geometry.mode == "block"
    for rid, record in state.requests.items():
        # In block mode page 0 is vLLM's null block and may fill many positions.
        pages = [p for p in record.pages if p or not block_mode]
        if len(pages) != len(set(pages)):
            out.append(f"request {rid!r} maps a page twice: {pages}")
    return out


# -- TRANSITIONS -----------------------------------------------------------------------
TRANSITIONS: dict[str, EdgeCheck] = {}


def _transition(name: str) -> Callable[[EdgeCheck], EdgeCheck]:
    def register(fn: EdgeCheck) -> EdgeCheck:
        TRANSITIONS[name] = fn
        return fn

    return register


def _slot_pages(slots: Iterable[int], size: int) -> set[int]:
    return {slot // size for slot in slots}


def named_requests(state: State, event: ev.Event) -> set[Any] | None:
    """Requests an event names (``None``: all of them)."""
    if isinstance(event, ev.ReqAlloc | ev.ReqFree):
        return set(event.requests)
    if isinstance(event, ev.Allocate | ev.Append):
        return {rid for rid, _ in event.items}
    if isinstance(event, ev.Assign | ev.Share | ev.Truncate):
        return {event.request}
    if isinstance(event, ev.Reset) and event.scope in ("rows", "all"):
        return None
    return set()


def named_pages(state: State, event: ev.Event) -> set[int] | None:
    size = state.geometry.page_size
    if isinstance(event, ev.Allocate):
        return set(event.pages) | {s // size for _, slots in event.items for s in slots}
    if isinstance(event, ev.Free):
        return set(event.pages)
    if isinstance(event, ev.Share | ev.Insert):
        return _slot_pages(event.slots, size)
    if isinstance(event, ev.Assign):
        return _slot_pages(event.slots, size) | set(state.requests[event.request].pages)
    if isinstance(event, ev.Truncate):
        return set(state.requests[event.request].pages)
    if isinstance(event, ev.ReqFree):
        return {p for rid in event.requests for p in state.requests[rid].pages}
    if isinstance(event, ev.Split):
        return set(state.nodes[event.node].pages)
    if isinstance(event, ev.Evict):
        return {p for n in event.nodes if n in state.nodes for p in state.nodes[n].pages}
    if isinstance(event, ev.Reset):
        return None
    return set()


def named_nodes(state: State, event: ev.Event) -> set[int] | None:
    if isinstance(event, ev.Insert):
        return {event.parent, event.node}
    if isinstance(event, ev.Split):
        return {event.node, event.new_node, state.nodes[event.node].parent}
    if isinstance(event, ev.Touch):
        return set(event.nodes)
    if isinstance(event, ev.Lock | ev.Unlock):
        return set(state.path_to_root(event.node))
    if isinstance(event, ev.Evict):
        return set(event.nodes) | {state.nodes[n].parent for n in event.nodes if n in state.nodes}
    if isinstance(event, ev.Reset) and event.scope in ("tree", "all"):
        return None
    return set()


_CHANGED_MEMO: list[Any] = [None, None, set()]  # last (before, after, result): frame and
# refcount_delta ask for the same edge back to back


def changed_pages(before: State, after: State) -> set[int]:
    """Pages whose free-list membership, holders or tree node differ between two states."""
    memo = _CHANGED_MEMO
    if memo[0] is before and memo[1] is after:
        return set(memo[2])
    result = _changed_pages(before, after)
    memo[0], memo[1], memo[2] = before, after, result
    return set(result)


def _changed_pages(before: State, after: State) -> set[int]:
    free_before, free_after = set(before.free_pages), set(after.free_pages)
    out = free_before ^ free_after
    for old, new in ((before.holders, after.holders), (before.page_node, after.page_node)):
        if old is new:
            continue
        for page in set(old.keys()) | set(new.keys()):
            if old.get(page) != new.get(page):
                out.add(page)
    return out


def _changed_ids(old: Any, new: Any) -> set[Any]:
    if old is new:
        return set()
    return {k for k in set(old.keys()) | set(new.keys()) if old.get(k) != new.get(k)}


@_transition("frame")
def _frame(before: State, event: ev.Event, after: State) -> list[str]:
    """An event changes only the pages, requests and nodes it names."""
    out = []
    name = type(event).__name__
    pages = named_pages(before, event)
    if pages is not None:
        changed = changed_pages(before, after)
        if changed - pages:
            out.append(f"{name} changed unnamed pages {sorted(changed - pages)}")
        order_before = [p for p in before.free_pages if p not in pages]
        order_after = [p for p in after.free_pages if p not in pages]
        if order_before != order_after:
            out.append(f"{name} reordered free pages it does not name")
    requests = named_requests(before, event)
    if requests is not None:
        for rid in _changed_ids(before.requests, after.requests) - requests:
            out.append(f"{name} changed unnamed request {rid!r}")
    nodes = named_nodes(before, event)
    if nodes is not None:
        for nid in _changed_ids(before.nodes, after.nodes) - nodes:
            out.append(f"{name} changed unnamed node {nid}")
    return out


@_transition("evict_locked")
def _evict_locked(before: State, event: ev.Event, after: State) -> list[str]:
    """Pages of a locked node stay in the tree (only a tree reset may drop them)."""
    if isinstance(event, ev.Reset) and event.scope in ("tree", "all"):
        return []
    out = []
    for nid, node in before.nodes.items():
        if nid == ROOT or node.lock_ref == 0:
            continue
        lost = [p for p in node.pages if p not in after.page_node]
        if lost:
            out.append(f"{type(event).__name__} removed pages {lost} of locked node {nid}")
    return out


@_transition("free_isolation")
def _free_isolation(before: State, event: ev.Event, after: State) -> list[str]:
    """Closing, truncating or freeing never changes another request's table."""
    requests = named_requests(before, event)
    if requests is None:
        return []
    out = []
    for rid, record in before.requests.items():
        if rid in requests:
            continue
        new = after.requests.get(rid)
        if new is None or list(new.pages) != list(record.pages) or new.allocated != record.allocated:
            out.append(f"{type(event).__name__} changed the table of unnamed request {rid!r}")
    return out


def _release_delta(before: State, releases: dict[int, set[Any]]) -> dict[int, int]:
    """Refcount change when ``releases[page]`` requests drop their hold on ``page``."""
    delta = {}
    for page, leaving in releases.items():
        held = set(before.holders.get(page, ())) - {DETACHED}
        gone = held & leaving
        remaining = held - gone
        orphan = not remaining and page not in before.page_node and gone
        delta[page] = -len(gone) + (1 if orphan else 0)
    return delta


def declared_refcount_delta(before: State, event: ev.Event) -> dict[int, int] | None:
    """Per-page refcount change an event declares (``None``: not declared, e.g. Reset)."""
    size = before.geometry.page_size
    if isinstance(event, ev.Allocate):
        return {p: 1 for p in event.pages}
    if isinstance(event, ev.Free):
        return {p: -1 for p in event.pages}
    if isinstance(event, ev.Share):
        return {p: 1 for p in _slot_pages(event.slots, size)}
    if isinstance(event, ev.Evict):
        return {p: -1 for n in event.nodes for p in before.nodes[n].pages}
    if isinstance(event, ev.ReqFree):
        releases: dict[int, set[Any]] = {}
        for rid in event.requests:
            for page in before.requests[rid].pages:
                releases.setdefault(page, set()).add(rid)
        return _release_delta(before, releases)
    if isinstance(event, ev.Truncate):
        record = before.requests[event.request]
        keep = -(-event.length // size)
        kept = set(record.pages[:keep])
        return _release_delta(before, {p: {event.request} for p in record.pages[keep:]
                                       if p not in kept})
    if isinstance(event, ev.Assign | ev.Reset):
        return None
    return {}


@_transition("refcount_delta")
def _refcount_delta(before: State, event: ev.Event, after: State) -> list[str]:
    """Each page's refcount moves by exactly the event's declared effect."""
    declared = declared_refcount_delta(before, event)
    universe = changed_pages(before, after)  # refcounts move only where holders or nodes do
    out = []
    if declared is None:
        if isinstance(event, ev.Assign):
            old = set(before.requests[event.request].pages)
            for page in universe:
                change = after.refcount(page) - before.refcount(page)
                if change and not (page in old and change == -1):
                    out.append(f"Assign moved refcount of page {page} by {change}")
        return out
    for page in universe | set(declared):
        change = after.refcount(page) - before.refcount(page)
        if change != declared.get(page, 0):
            out.append(f"{type(event).__name__} moved refcount of page {page} by {change}, "
                       f"declared {declared.get(page, 0)}")
    return out


@_transition("clock_monotone")
def _clock_monotone(before: State, event: ev.Event, after: State) -> list[str]:
    """Logical time and node ids never go back; no node's access time decreases."""
    out = []
    if after.clock < before.clock:
        out.append(f"clock went back from {before.clock} to {after.clock}")
    if after.next_node_id < before.next_node_id:
        out.append("node ids went back")
    for nid, node in after.nodes.items():
        old = before.nodes.get(nid)
        if old is not None and node.last_access < old.last_access:
            out.append(f"node {nid} access time went back")
    return out


# -- SOMETIMES -------------------------------------------------------------------------
SOMETIMES: dict[str, Callable[[Edge], bool]] = {}


def _sometimes(name: str) -> Callable[[Callable[[Edge], bool]], Callable[[Edge], bool]]:
    def register(fn: Callable[[Edge], bool]) -> Callable[[Edge], bool]:
        SOMETIMES[name] = fn
        return fn

    return register


@_sometimes("shared_page")
def _shared_page(edge: Edge) -> bool:
    """A page mapped by the tables of two or more open requests."""
    seen: dict[int, int] = {}
    for record in edge.after.requests.values():
        for page in set(record.pages):
            seen[page] = seen.get(page, 0) + 1
            if seen[page] >= 2:
                return True
    return False


@_sometimes("split")
def _split(edge: Edge) -> bool:
    return any(isinstance(e, ev.Split) for e in edge.events)


@_sometimes("evict_under_partial_locks")
def _evict_partial_locks(edge: Edge) -> bool:
    """An eviction while some other node is locked."""
    return any(isinstance(e, ev.Evict) for e in edge.events) and any(
        nid != ROOT and node.lock_ref > 0 for nid, node in edge.before.nodes.items())


@_sometimes("alloc_needed_eviction")
def _alloc_needed_eviction(edge: Edge) -> bool:
    """An allocation took a page that an eviction just released."""
    steps = list(edge.previous) + list(edge.events)
    for index, event in enumerate(steps):
        if isinstance(event, ev.Allocate) and index > 0 and isinstance(steps[index - 1], ev.Evict):
            if index >= len(edge.previous):  # the allocation is part of this step
                return True
    return False


@_sometimes("cached_page_revived")
def _revived(edge: Edge) -> bool:
    """An evictable (unlocked) cached node is locked again or mapped by a request (a hit)."""
    before = edge.before
    for event in edge.events:
        if isinstance(event, ev.Lock) and event.node in before.nodes and event.node != ROOT:
            node = before.nodes[event.node]
            if node.lock_ref == 0 and node.last_access < edge.after.clock:
                return True
        if isinstance(event, ev.Assign | ev.Share):
            size = before.geometry.page_size
            for page in _slot_pages(event.slots, size):
                owner = before.page_node.get(page)
                if owner is not None and before.nodes[owner].lock_ref == 0:
                    return True
    return False


def check_state(state: State) -> list[tuple[str, str]]:
    """Every ALWAYS violation as ``(name, message)``."""
    return [(name, msg) for name, fn in ALWAYS.items() for msg in fn(state)]


def check_edge(before: State, event: ev.Event, after: State) -> list[tuple[str, str]]:
    """Every TRANSITIONS violation on one accepted edge as ``(name, message)``."""
    return [(name, msg) for name, fn in TRANSITIONS.items() for msg in fn(before, event, after)]
