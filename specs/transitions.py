"""TRANSITIONS: properties of every edge the rules accept (TLC's implied actions).

``TRANSITIONS[name](before, event, after) -> list[str]``, checked even when
``after`` was seen before.  ``before`` and ``after`` are frozen ``State``s or
``LiveState``s.  What an event *names* (its pages, requests, nodes and host
copies) is spelled out per event kind in ``specs.naming``; the frame
property says nothing else changes.  Ids and meanings: specs/SPEC.md T1-T5.
Pure.  ``specs.invariants`` re-exports the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvstate import events as ev
from kvstate.state import DETACHED, ROOT, State, refcount
from specs.naming import named_host_nodes, named_nodes, named_pages, named_requests

EdgeCheck = Callable[[Any, ev.Event, Any], list[str]]
TRANSITIONS: dict[str, EdgeCheck] = {}


def _transition(name: str) -> Callable[[EdgeCheck], EdgeCheck]:
    def register(fn: EdgeCheck) -> EdgeCheck:
        TRANSITIONS[name] = fn
        return fn

    return register


class _Memo:
    """One-entry caches keyed by object identity: the explorer checks every candidate
    event of one state in a row (the same ``before``), and several properties ask for
    the same edge back to back.  Holding the keyed objects keeps their ids valid."""

    def __init__(self) -> None:
        self.free_of: tuple[Any, list[int], set[int]] | None = None
        self.other_free: tuple[Any, list[int], set[int]] | None = None
        self.changed: tuple[Any, Any, set[int]] | None = None

    def free(self, state: Any) -> tuple[list[int], set[int]]:
        """``state``'s free pages in queue order, and as a set (cached for frozen states
        only: a live state changes under the same identity)."""
        if not isinstance(state, State):
            order = list(state.free_pages)
            return order, set(order)
        for entry in (self.free_of, self.other_free):
            if entry is not None and entry[0] is state:
                return entry[1], entry[2]
        order = list(state.free_pages)
        self.other_free, self.free_of = self.free_of, (state, order, set(order))
        return order, self.free_of[2]


_MEMO = _Memo()


def free_pages_of(state: Any) -> tuple[list[int], set[int]]:
    return _MEMO.free(state)


def changed_pages(before: Any, after: Any) -> set[int]:
    """Pages whose free-list membership, holders or tree node differ between two states."""
    memo = _MEMO.changed
    if memo is not None and memo[0] is before and memo[1] is after and isinstance(after, State):
        return set(memo[2])
    if after.free_pages is before.free_pages:  # a persistent queue the event did not touch
        out: set[int] = set()
    else:
        out = free_pages_of(before)[1] ^ free_pages_of(after)[1]
    for old, new in ((before.holders, after.holders), (before.page_node, after.page_node)):
        if old is not new:
            out.update(_changed_ids(old, new))
    _MEMO.changed = (before, after, out)
    return set(out)


def _changed_ids(old: Any, new: Any) -> set[Any]:
    """Keys whose values differ (an unchanged entry of a persistent map is the same object)."""
    if old is new:
        return set()
    out = {k for k, v in new.items() if (w := old.get(k, _MISSING)) is not v and w != v}
    out.update(k for k in old.keys() if k not in new)
    return out


_MISSING = object()


@_transition("frame")
def _frame(before: Any, event: ev.Event, after: Any) -> list[str]:
    """An event changes only the pages, requests, nodes and host copies it names."""
    out = []
    name = type(event).__name__
    pages = named_pages(before, event)
    if pages is not None:
        changed = changed_pages(before, after)
        if changed - pages:
            out.append(f"{name} changed unnamed pages {sorted(changed - pages)}")
        if after.free_pages is not before.free_pages:
            order_before = [p for p in free_pages_of(before)[0] if p not in pages]
            order_after = [p for p in free_pages_of(after)[0] if p not in pages]
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
    host_nodes = named_host_nodes(before, event)
    if before.host is not None and after.host is not None and host_nodes is not None:
        changed_host = (_changed_ids(before.host.backup, after.host.backup)
                        | _changed_ids(before.host.evicted, after.host.evicted))
        for nid in sorted(changed_host - host_nodes):
            out.append(f"{name} changed the host copy of unnamed node {nid}")
    return out


@_transition("evict_locked")
def _evict_locked(before: Any, event: ev.Event, after: Any) -> list[str]:
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
def _free_isolation(before: Any, event: ev.Event, after: Any) -> list[str]:
    """Closing, truncating or freeing never changes another request's table."""
    requests = named_requests(before, event)
    if requests is None:
        return []
    out = []
    for rid, record in before.requests.items():
        if rid in requests:
            continue
        new = after.requests.get(rid)
        if new is record:
            continue
        if new is None or list(new.pages) != list(record.pages) or new.allocated != record.allocated:
            out.append(f"{type(event).__name__} changed the table of unnamed request {rid!r}")
    return out


def _release_delta(before: Any, releases: dict[int, set[Any]]) -> dict[int, int]:
    """Refcount change when ``releases[page]`` requests drop their hold on ``page``: minus
    one per hold, plus one where the page is left to nobody (it becomes DETACHED)."""
    block = before.geometry.mode == "block"
    delta = {}
    for page, leaving in releases.items():
        entries = before.holders.get(page, ())
        held = {h for h in entries if h != DETACHED or isinstance(h, str)}
        gone = held & leaving
        kept = (held - gone) or (block and len(held) != len(entries))  # pool references stay
        tree = not block and page in before.page_node  # radix: the tree keeps holding it
        delta[page] = -len(gone) + (1 if gone and not kept and not tree else 0)
    return delta


def _req_free_delta(before: Any, event: Any) -> dict[int, int]:
    releases: dict[int, set[Any]] = {}
    for rid in event.requests:
        for page in _mapped(before.requests[rid]):
            releases.setdefault(page, set()).add(rid)
    return _release_delta(before, releases)


def _truncate_delta(before: Any, event: Any) -> dict[int, int]:
    record = before.requests[event.request]
    keep = -(-event.length // before.geometry.page_size)
    mapped = dict(enumerate(record.pages))
    for index in record.dangling:
        del mapped[index]
    kept = {p for i, p in mapped.items() if i < keep}
    return _release_delta(before, {p: {event.request} for i, p in mapped.items()
                                   if i >= keep and p not in kept})


_DECLARED: dict[type, Callable[[Any, Any], dict[int, int] | None]] = {
    ev.Allocate: lambda b, e: {p: 1 for p in e.pages},
    ev.BlockAlloc: lambda b, e: {p: 1 for p in e.pages},
    ev.Free: lambda b, e: {p: -1 for p in e.pages},
    ev.FreeMapped: lambda b, e: {p: -1 for p in e.pages},
    ev.Share: lambda b, e: {slot // b.geometry.page_size: 1 for slot in e.slots},
    ev.Load: lambda b, e: {p: 1 for p in e.pages},  # the tree holds the loaded pages
    ev.BlockHold: lambda b, e: _counts([p for p in e.pages if p], 1),
    ev.BlockRelease: lambda b, e: _counts([p for p in e.pages if p], -1),
    ev.Evict: lambda b, e: {p: -1 for n in e.nodes for p in b.nodes[n].pages},
    ev.ReqFree: _req_free_delta,
    ev.Truncate: _truncate_delta,
    ev.Assign: lambda b, e: None,
    ev.Scatter: lambda b, e: None,
    ev.Reset: lambda b, e: None,
    # the node's old pages go free; the owner's holds on the new ones move to the tree
    ev.SwaAdopt: lambda b, e: {p: -1 for p in b.nodes[e.node].pages},
}


def declared_refcount_delta(before: Any, event: ev.Event) -> dict[int, int] | None:
    """Per-page refcount change an event declares (``None``: not declared, e.g. Reset;
    an event not listed moves no refcount)."""
    declare = _DECLARED.get(type(event))
    return {} if declare is None else declare(before, event)


def _counts(pages: list[int], sign: int) -> dict[int, int]:
    out: dict[int, int] = {}
    for page in pages:
        out[page] = out.get(page, 0) + sign
    return out


def _mapped(record: Any) -> list[int]:
    gone = set(record.dangling)
    return [p for i, p in enumerate(record.pages) if i not in gone]


@_transition("refcount_delta")
def _refcount_delta(before: Any, event: ev.Event, after: Any) -> list[str]:
    """Each page's refcount moves by exactly the event's declared effect; a table write
    (Assign, Scatter) moves none but may drop one hold on a page it overwrites."""
    declared = declared_refcount_delta(before, event)
    universe = changed_pages(before, after)  # refcounts move only where holders or nodes do
    out = []
    name = type(event).__name__
    if declared is None:
        if isinstance(event, ev.Assign | ev.Scatter):
            rows = [event.request] if isinstance(event, ev.Assign) else [r for r, _, _ in event.items]
            old = {p for rid in rows for p in _mapped(before.requests[rid])}
            for page in universe:
                change = refcount(after, page) - refcount(before, page)
                if change and not (page in old and change == -1):
                    out.append(f"{name} moved refcount of page {page} by {change}")
        return out
    for page in universe | set(declared):
        change = refcount(after, page) - refcount(before, page)
        if change != declared.get(page, 0):
            out.append(f"{name} moved refcount of page {page} by {change}, "
                       f"declared {declared.get(page, 0)}")
    return out


@_transition("clock_monotone")
def _clock_monotone(before: Any, event: ev.Event, after: Any) -> list[str]:
    """Logical time and node ids never go back; no node's access time decreases."""
    out = []
    if after.clock < before.clock:
        out.append(f"clock went back from {before.clock} to {after.clock}")
    if after.next_node_id < before.next_node_id:
        out.append("node ids went back")
    for nid, node in after.nodes.items():
        old = before.nodes.get(nid)
        if old is not None and old is not node and node.last_access < old.last_access:
            out.append(f"node {nid} access time went back")
    return out
