"""SOMETIMES: behaviours a checking run must witness at least once (non-vacuity).

``SOMETIMES[name](edge) -> bool`` over one accepted step.  A scope lists
the probes that apply to it (``Scope.probes``): a scope that never shares a
page, never leaves a dangling entry or never loads a host-only node back
proves nothing about those.  Ids and meanings: specs/SPEC.md S1-S12.  Pure.
``specs.invariants`` re-exports the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from kvstate import events as ev
from kvstate.state import ROOT


@attrs.frozen
class Edge:
    """What a SOMETIMES probe sees: one step (one event, or one planner command)."""

    before: Any
    events: tuple[ev.Event, ...]
    after: Any
    previous: tuple[ev.Event, ...] = ()  # the events of the step that led to ``before``


Probe = Callable[[Edge], bool]
SOMETIMES: dict[str, Probe] = {}


def _sometimes(name: str) -> Callable[[Probe], Probe]:
    def register(fn: Probe) -> Probe:
        SOMETIMES[name] = fn
        return fn

    return register


def _mapped(record: Any) -> set[int]:
    gone = set(record.dangling)
    return {p for i, p in enumerate(record.pages) if i not in gone}


@_sometimes("shared_page")
def _shared_page(edge: Edge) -> bool:
    """A page mapped by the tables of two or more open requests."""
    seen: set[int] = set()
    for record in edge.after.requests.values():
        pages = _mapped(record) - {0}
        if seen & pages:
            return True
        seen |= pages
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
            for page in {slot // size for slot in event.slots}:
                owner = before.page_node.get(page)
                if owner is not None and before.nodes[owner].lock_ref == 0:
                    return True
    return False


@_sometimes("dangling_rewritten")
def _dangling_rewritten(edge: Edge) -> bool:
    """A row write lands on an entry whose page was freed under the row (SGLang reuses it)."""
    for event in edge.events:
        if isinstance(event, ev.Assign | ev.Scatter):
            rows = [event.request] if isinstance(event, ev.Assign) else [r for r, _, _ in event.items]
            for rid in rows:
                old, new = edge.before.requests[rid], edge.after.requests.get(rid)
                if new is not None and set(old.dangling) - set(new.dangling):
                    return True
    return False


@_sometimes("scatter_two_rows")
def _scatter_two_rows(edge: Edge) -> bool:
    """One Scatter writes two rows at once (a batched decode step)."""
    return any(isinstance(e, ev.Scatter) and len(e.items) > 1 for e in edge.events)


@_sometimes("block_revived")
def _block_revived(edge: Edge) -> bool:
    """A cached block with no holder (queued, an eviction candidate) is held again (a hit)."""
    before = edge.before
    return any(isinstance(e, ev.BlockHold) and any(
        p in before.page_node and p in before.free_pages for p in e.pages) for e in edge.events)


@_sometimes("hollow_node")
def _hollow_node(edge: Edge) -> bool:
    """A block-mode node keeps its chain position with no copy of its own."""
    return any(n != ROOT and not node.pages for n, node in edge.after.nodes.items())


@_sometimes("shared_block")
def _shared_block(edge: Edge) -> bool:
    """A block held twice: by two requests, or by a request and the pool."""
    return any(len(held) > 1 for held in edge.after.holders.values())


@_sometimes("evicted_to_host")
def _evicted_to_host(edge: Edge) -> bool:
    """An eviction keeps a backed-up node as host-only."""
    host = edge.after.host
    return host is not None and any(isinstance(e, ev.Evict) and any(n in host.evicted for n in e.nodes)
                                    for e in edge.events)


@_sometimes("host_only_loaded")
def _host_only_loaded(edge: Edge) -> bool:
    return any(isinstance(e, ev.Load) for e in edge.events)
