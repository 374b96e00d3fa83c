"""Index planning for the executor: ``plan_indices(before, after, event) -> IndexPlan``.

This module is pure (no torch, no clock, no randomness): it reads two
immutable states and one event and returns plain index lists saying which
bytes an executor must move and which token positions changed meaning.  The
executor and the integrity monitor act on the plan; they never decide.

What the fields mean (slots are ``page * page_size + offset``)::

    copy_src / copy_dst   slot i of copy_src is copied to slot i of copy_dst (all layers)
    freed_slots           slots whose page went back to the free list (content now garbage)
    new_tokens            (request, position, slot): fresh table entries a forward pass writes
    linked_tokens         (request, position, slot): table entries that now read bytes
                          already in the pool (tree pages, shared pages, moved own pages)
    truncated             (request, length): table cut to ``length`` positions
    opened / closed       requests opened / closed by this event
    inserted              (node, depth, slots): a new tree node and its first token's depth
    split                 (node, at, new_node): new_node took the node's first ``at`` tokens
    dropped_nodes         tree nodes that left the tree
    reset_requests/nodes  every request / every node was dropped (``Reset``)
    host_out_src/_dst     device slot i is copied to host slot i (a backup; all layers)
    host_in_src/_dst      host slot i is copied to device slot i (a load-back)
    host_freed            host slots whose copy was dropped
    demoted_nodes         nodes whose device copy was evicted but stay host-only
    loaded_nodes          host-only nodes put back on the device
    nulled_tokens         (request, position, slot): block mode, table entries that now map
                          the null page 0 (slot = position % page_size); no live KV there
    cached_blocks         (node, depth, slots): block mode, a held page that became a cached
                          copy of tree node ``node`` whose first token is at ``depth``

Block-mode events (``kvstate.events_block``) are planned in
:mod:`kvstate.executor.plan_block`; none of them copies bytes.

Every field is a tuple; an event that moves nothing gets ``IndexPlan()``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from kvstate.events import (
    Allocate,
    Assign,
    Copy,
    Event,
    Evict,
    Free,
    Insert,
    ReqAlloc,
    ReqFree,
    Reset,
    Share,
    Split,
    Truncate,
)
from kvstate.state import DETACHED, ROOT, RequestId, State, expand_pages

TokenRef = tuple[RequestId, int, int]  # (request, position, slot)


@attrs.frozen
class IndexPlan:
    """Plain index lists derived from one event (immutable)."""

    copy_src: tuple[int, ...] = ()
    copy_dst: tuple[int, ...] = ()
    freed_slots: tuple[int, ...] = ()
    new_tokens: tuple[TokenRef, ...] = ()
    linked_tokens: tuple[TokenRef, ...] = ()
    truncated: tuple[tuple[RequestId, int], ...] = ()
    opened: tuple[RequestId, ...] = ()
    closed: tuple[RequestId, ...] = ()
    inserted: tuple[tuple[int, int, tuple[int, ...]], ...] = ()
    split: tuple[tuple[int, int, int], ...] = ()
    dropped_nodes: tuple[int, ...] = ()
    reset_requests: bool = False
    reset_nodes: bool = False
    host_out_src: tuple[int, ...] = ()
    host_out_dst: tuple[int, ...] = ()
    host_in_src: tuple[int, ...] = ()
    host_in_dst: tuple[int, ...] = ()
    host_freed: tuple[int, ...] = ()
    demoted_nodes: tuple[int, ...] = ()
    loaded_nodes: tuple[int, ...] = ()
    nulled_tokens: tuple[TokenRef, ...] = ()
    cached_blocks: tuple[tuple[int, int, tuple[int, ...]], ...] = ()

    @property
    def moves_bytes(self) -> bool:
        return bool(self.copy_src or self.freed_slots or self.host_out_src or self.host_in_src)


EMPTY_PLAN = IndexPlan()
Planner = Callable[[State, State, Event], IndexPlan]
PLANNERS: dict[type[Event], Planner] = {}


def plans(event_type: type[Event]) -> Callable[[Planner], Planner]:
    """Register the index planner of an event type (other modules add their own)."""

    def register(fn: Planner) -> Planner:
        PLANNERS[event_type] = fn
        return fn

    return register


def plan_indices(before: State, after: State, event: Event) -> IndexPlan:
    """The index lists of ``event``, which took ``before`` to ``after`` (pure)."""
    planner = PLANNERS.get(type(event))
    return EMPTY_PLAN if planner is None else planner(before, after, event)


class PageSlots(tuple[int, ...]):
    """The slots of whole ``pages`` in order: a plain tuple that also remembers its pages.

    Executors read ``pages`` to copy page by page without re-deriving them
    from the slots; everything else sees an ordinary immutable tuple.
    """

    pages: tuple[int, ...]
    page_size: int

    def __new__(cls, pages: Sequence[int], page_size: int) -> PageSlots:
        slots = super().__new__(cls, expand_pages(pages, page_size))
        slots.pages = tuple(pages)
        slots.page_size = page_size
        return slots


def page_slots(pages: Sequence[int], page_size: int) -> tuple[int, ...]:
    """Every slot of ``pages`` (a :class:`PageSlots`)."""
    return PageSlots(pages, page_size)


def node_depth(state: State, node_id: int) -> int:
    """Tokens above ``node_id``'s first token (sum of its ancestors' key lengths)."""
    nodes = state.nodes
    depth = 0
    current = nodes[node_id].parent
    while current != ROOT:
        node = nodes[current]
        depth += len(node.key)
        current = node.parent
    return depth


# -- rows ---------------------------------------------------------------------
@plans(ReqAlloc)
def _req_alloc(before: State, after: State, event: Event) -> IndexPlan:
    assert isinstance(event, ReqAlloc)
    return IndexPlan(opened=event.requests)


@plans(ReqFree)
def _req_free(before: State, after: State, event: Event) -> IndexPlan:
    assert isinstance(event, ReqFree)
    return IndexPlan(closed=event.requests)


# -- pages ----------------------------------------------------------------------
@plans(Allocate)
def _allocate(before: State, after: State, event: Event) -> IndexPlan:
    assert isinstance(event, Allocate)
    tokens: list[TokenRef] = []
    for request_id, slots in event.items:
        start = before.requests[request_id].allocated
        tokens.extend((request_id, start + index, slot) for index, slot in enumerate(slots))
    return IndexPlan(new_tokens=tuple(tokens))


@plans(Assign)
def _assign(before: State, after: State, event: Event) -> IndexPlan:
    assert isinstance(event, Assign)
    request_id = event.request
    size = before.geometry.page_size
    old = before.requests[request_id]
    old_pages = set(old.pages)
    new_tokens: list[TokenRef] = []
    linked: list[TokenRef] = []
    for position, slot in enumerate(event.slots, start=event.start):
        page = slot // size
        if position < old.allocated:
            old_slot = old.pages[position // size] * size + position % size
            if old_slot == slot:
                continue
        if page in after.page_node:
            linked.append((request_id, position, slot))
        elif page not in old_pages and before.holders.get(page) == (DETACHED,):
            new_tokens.append((request_id, position, slot))
        else:
            linked.append((request_id, position, slot))
    return IndexPlan(new_tokens=tuple(new_tokens), linked_tokens=tuple(linked))


@plans(Share)
def _share(before: State, after: State, event: Event) -> IndexPlan:
    assert isinstance(event, Share)
    return IndexPlan(linked_tokens=tuple(
        (event.request, position, slot) for position, slot in enumerate(event.slots, start=event.start)))


@plans(Truncate)
def _truncate(before: State, after: State, event: Event) -> IndexPlan:
    assert isinstance(event, Truncate)
    return IndexPlan(truncated=((event.request, event.length),))


@plans(Free)
def _free(before: State, after: State, event: Event) -> IndexPlan:
    assert isinstance(event, Free)
    return IndexPlan(freed_slots=page_slots(event.pages, before.geometry.page_size))


@plans(Copy)
def _copy(before: State, after: State, event: Event) -> IndexPlan:
    assert isinstance(event, Copy)
    size = before.geometry.page_size
    return IndexPlan(copy_src=page_slots(event.src_pages, size),
                     copy_dst=page_slots(event.dst_pages, size))


# -- tree -----------------------------------------------------------------------
@plans(Insert)
def _insert(before: State, after: State, event: Event) -> IndexPlan:
    assert isinstance(event, Insert)
    return IndexPlan(inserted=((event.node, node_depth(after, event.node), event.slots),))


@plans(Split)
def _split(before: State, after: State, event: Event) -> IndexPlan:
    assert isinstance(event, Split)
    return IndexPlan(split=((event.node, event.at, event.new_node),))


@plans(Evict)
def _evict(before: State, after: State, event: Event) -> IndexPlan:
    assert isinstance(event, Evict)
    freed = [page for node_id in event.nodes for page in before.nodes[node_id].pages
             if page not in after.holders and page not in after.page_node]
    return IndexPlan(freed_slots=page_slots(freed, before.geometry.page_size),
                     dropped_nodes=event.nodes)


@plans(Reset)
def _reset(before: State, after: State, event: Event) -> IndexPlan:
    assert isinstance(event, Reset)
    was_held = set(before.holders.keys()) | set(before.page_node.keys())
    now_held = set(after.holders.keys()) | set(after.page_node.keys())
    freed = sorted(was_held - now_held)
    closed = tuple(r for r in before.requests.keys() if r not in after.requests)
    dropped = tuple(n for n in before.nodes.keys() if n != ROOT and n not in after.nodes)
    return IndexPlan(freed_slots=page_slots(freed, before.geometry.page_size), closed=closed,
                     dropped_nodes=dropped, reset_requests=bool(closed) and not after.requests,
                     reset_nodes=len(after.nodes) == 1)
