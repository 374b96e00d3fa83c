"""Host-tier policy: when to back tree nodes up, what to load back, what to drop.

Two write policies (SGLang's ``--hicache-write-policy``):

* ``write_through``: a node is backed up as soon as it is inserted;
* ``write_back``: a node is backed up only when it is about to be evicted.

Either way an evicted backed-up node stays in the tree as host-only and a
later prefix match loads it back (``plan_match_tiered``).  Backups are
root-closed: backing a node up first backs up every ancestor that has no
copy.  When the host is full, host-only leaves are dropped, least recently
used first (``plan_host_evict``); when that is not enough, the node is not
backed up (write-through) or is evicted without a copy (write-back).

Every function is pure: it takes a ``TieredState`` and returns a
``TieredPlan`` whose events were validated by the tiered reducer.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import attrs

from kvstate.events import Event, Evict, Lock, Unlock
from kvstate.events_host import HostFree, Load, Offload
from kvstate.planner.alloc import new_pages_for_extend, plan_extend
from kvstate.planner.builder import Plan
from kvstate.planner.evict import eviction_order
from kvstate.planner.requests import RequestCursor, plan_checkpoint
from kvstate.planner.tree_ops import InsertResult, MatchResult, plan_insert, plan_match
from kvstate.reducer.host import apply_tiered
from kvstate.state import ROOT, RequestId
from kvstate.state_host import TieredState

R = TypeVar("R")
WRITE_THROUGH = "write_through"
WRITE_BACK = "write_back"
POLICIES = (WRITE_THROUGH, WRITE_BACK)


@attrs.frozen
class TieredPlan(Generic[R]):
    events: tuple[Event, ...]
    state: TieredState
    result: R
    base: TieredState


class TieredBuilder:
    """Scratch accumulator (mutates itself only), like ``PlanBuilder`` for tiered states."""

    def __init__(self, state: TieredState) -> None:
        self.base = state
        self.state = state
        self.events: list[Event] = []

    def emit(self, event: Event) -> TieredState:
        self.state = apply_tiered(self.state, event)
        self.events.append(event)
        return self.state

    def adopt(self, plan: Plan[Any]) -> Any:
        """Re-apply a core plan's events through the tiered reducer; returns its result."""
        for event in plan.events:
            self.emit(event)
        return plan.result

    def done(self, result: R) -> TieredPlan[R]:
        return TieredPlan(tuple(self.events), self.state, result, self.base)


def _check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")


# -- host capacity -----------------------------------------------------------------------
def host_only_leaves(state: TieredState) -> list[int]:
    host = state.host
    parents = {parent for parent, _ in host.evicted_children.keys()}
    return [n for n in host.evicted.keys() if n not in parents]


def plan_host_evict(builder: TieredBuilder, num_pages: int) -> None:
    """Drop host-only leaves (LRU, cascading) until ``num_pages`` host pages are free."""
    host = builder.state.host
    if len(host.free_pages) >= num_pages:
        return
    heap = [(host.evicted[n].last_access, n) for n in host_only_leaves(builder.state)]
    heapq.heapify(heap)
    while heap and len(builder.state.host.free_pages) < num_pages:
        _, node_id = heapq.heappop(heap)
        record = builder.state.host.evicted[node_id]
        builder.emit(HostFree((node_id,)))
        parent = record.parent
        host = builder.state.host
        if parent in host.evicted and not host.host_children(parent):
            heapq.heappush(heap, (host.evicted[parent].last_access, parent))


def plan_backup(builder: TieredBuilder, node_id: int) -> bool:
    """Back up ``node_id`` and every ancestor without a copy (top down); False if no room."""
    state = builder.state
    if node_id == ROOT or node_id in state.host.backup:
        return True
    chain = [n for n in state.core.path_to_root(node_id) if n not in state.host.backup]
    chain.reverse()
    needed = sum(len(state.core.nodes[n].pages) for n in chain)
    plan_host_evict(builder, needed)
    if len(builder.state.host.free_pages) < needed:
        return False
    for node in chain:
        count = len(builder.state.core.nodes[node].pages)
        builder.emit(Offload(node, tuple(builder.state.host.free_pages.head(count))))
    return True


# -- device eviction and allocation ---------------------------------------------------------
def plan_evict_tiered(builder: TieredBuilder, num_tokens: int, *, policy: str, at_head: bool) -> int:
    """Evict at least ``num_tokens`` device tokens; write-back stages victims to host first."""
    _check_policy(policy)
    order = eviction_order(builder.state.core, num_tokens) if num_tokens > 0 else []
    if not order:
        return 0
    if policy == WRITE_BACK:
        for node_id in order:
            plan_backup(builder, node_id)
    nodes = builder.state.core.nodes
    evicted = sum(len(nodes[n].key) for n in order)
    builder.emit(Evict(tuple(order), at_head))
    return evicted


def ensure_free_pages(builder: TieredBuilder, pages: int, *, policy: str, at_head: bool) -> bool:
    available = len(builder.state.core.free_pages)
    if pages > available:
        size = builder.state.core.geometry.page_size
        plan_evict_tiered(builder, (pages - available) * size, policy=policy, at_head=at_head)
    return pages <= len(builder.state.core.free_pages)


def plan_extend_tiered(state: TieredState, items: Sequence[tuple[RequestId, int]], *, policy: str,
                       at_head: bool) -> TieredPlan[list[list[int]] | None]:
    """``plan_extend`` after evicting the deficit under the host policy (None on OOM)."""
    builder = TieredBuilder(state)
    size = state.core.geometry.page_size
    needed = sum(new_pages_for_extend(size, state.core.requests[r].allocated, n) for r, n in items)
    if not ensure_free_pages(builder, needed, policy=policy, at_head=at_head):
        return TieredBuilder(state).done(None)
    plan = plan_extend(builder.state.core, items, at_head=at_head)
    if plan is None:  # pragma: no cover - the deficit was covered above
        return TieredBuilder(state).done(None)
    return builder.done(builder.adopt(plan))


# -- match / insert with load-back ----------------------------------------------------------
def _host_hit(state: TieredState, key: Sequence[int], matched: MatchResult) -> int | None:
    rest = tuple(key[matched.length:])
    size = state.core.geometry.page_size
    if len(rest) < size or not rest:
        return None
    child_key = state.core.geometry.child_key(rest)
    return state.host.evicted_children.get((matched.last_node, child_key))


def load_prefix(builder: TieredBuilder, key: Sequence[int], *, policy: str, at_head: bool) -> MatchResult:
    """Match ``key``, loading host-only nodes on the path back to the device (all or as many fit)."""
    while True:
        matched = builder.adopt(plan_match(builder.state.core, key))
        hit = _host_hit(builder.state, key, matched)
        if hit is None:
            return matched
        record = builder.state.host.evicted[hit]
        need = len(record.key) // builder.state.core.geometry.page_size
        locked = matched.last_node != ROOT
        if locked:
            builder.emit(Lock(matched.last_node))  # keep the parent on the device while evicting
        room = ensure_free_pages(builder, need, policy=policy, at_head=at_head)
        if locked:
            builder.emit(Unlock(matched.last_node))
        if not room:
            return matched
        if hit not in builder.state.host.evicted:  # making room dropped it from the host: re-match
            continue
        pages = builder.state.core.free_pages.head(need)
        builder.emit(Load(hit, tuple(pages), builder.state.core.clock + 1))


def drop_host_subtree(builder: TieredBuilder, node_id: int) -> None:
    """Drop host-only ``node_id`` and every host-only node below it (leaves first)."""
    order: list[int] = []
    stack = [node_id]
    while stack:
        current = stack.pop()
        order.append(current)
        stack.extend(builder.state.host.host_children(current))
    builder.emit(HostFree(tuple(reversed(order))))


def _make_way_for_insert(builder: TieredBuilder, key: Sequence[int], *, policy: str,
                         at_head: bool) -> None:
    """Load host hits on ``key``; a host-only node that could not be loaded is dropped.

    The caller is about to insert its own copy of those tokens, so the host
    copy is redundant (one key, one node).
    """
    matched = load_prefix(builder, key, policy=policy, at_head=at_head)
    hit = _host_hit(builder.state, key, matched)
    if hit is not None:
        drop_host_subtree(builder, hit)


def plan_match_tiered(state: TieredState, key: Sequence[int], *, policy: str,
                      at_head: bool) -> TieredPlan[MatchResult]:
    """``plan_match`` that loads host hits back first (a hit on a host-only node is a hit)."""
    _check_policy(policy)
    builder = TieredBuilder(state)
    return builder.done(load_prefix(builder, key, policy=policy, at_head=at_head))


def plan_insert_tiered(state: TieredState, key: Sequence[int], slots: Sequence[int],
                       owner: RequestId, *, policy: str, at_head: bool) -> TieredPlan[InsertResult]:
    """Insert after loading host hits; write-through backs the new leaf up."""
    _check_policy(policy)
    builder = TieredBuilder(state)
    _make_way_for_insert(builder, key, policy=policy, at_head=at_head)
    result = builder.adopt(plan_insert(builder.state.core, key, slots, owner))
    if policy == WRITE_THROUGH:
        plan_backup(builder, result.last_node)
    return builder.done(result)


def plan_checkpoint_tiered(state: TieredState, cursor: RequestCursor, token_ids: Sequence[int], *,
                           prompt_len: int, up_to: int, policy: str,
                           at_head: bool) -> TieredPlan[RequestCursor]:
    """SGLang's checkpoint with host hits loaded first; write-through backs up what it inserts."""
    _check_policy(policy)
    builder = TieredBuilder(state)
    size = state.core.geometry.page_size
    aligned = up_to // size * size
    _make_way_for_insert(builder, token_ids[:aligned], policy=policy, at_head=at_head)
    if cursor.last_node != ROOT and cursor.last_node not in builder.state.core.nodes:
        raise ValueError(f"request {cursor.request!r} lost its locked node")  # pragma: no cover
    result = builder.adopt(plan_checkpoint(builder.state.core, cursor, token_ids,
                                           prompt_len=prompt_len, up_to=up_to, at_head=at_head))
    if policy == WRITE_THROUGH and result.last_node != ROOT:
        plan_backup(builder, result.last_node)
    return builder.done(result)
