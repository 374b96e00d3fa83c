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

Like every planner function these take a builder over a state with a host
tier and emit their events into it (``kvstate.planner.builder``).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

from kvstate.events import Evict, HostFree, Load, Lock, Offload, Unlock
from kvstate.planner.alloc import new_pages_for_extend, plan_extend
from kvstate.planner.builder import Builder
from kvstate.planner.evict import eviction_order, freed_pages
from kvstate.planner.requests import RequestCursor, plan_checkpoint
from kvstate.planner.tree_ops import InsertResult, MatchResult, plan_insert, plan_match
from kvstate.state import ROOT, RequestId, path_to_root

WRITE_THROUGH = "write_through"
WRITE_BACK = "write_back"
POLICIES = (WRITE_THROUGH, WRITE_BACK)


def _check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")


# -- host capacity -----------------------------------------------------------------------
def host_only_leaves(state: Any) -> list[int]:
    host = state.host
    parents = {parent for parent, _ in host.evicted_children.keys()}
    return [n for n in host.evicted.keys() if n not in parents]


def plan_host_evict(b: Builder, num_pages: int) -> None:
    """Drop host-only leaves (LRU, cascading) until ``num_pages`` host pages are free.

    Emits one ``HostFree`` per dropped node.
    """
    host = b.state.host
    if len(host.free_pages) >= num_pages:
        return
    heap = [(host.evicted[n].last_access, n) for n in host_only_leaves(b.state)]
    heapq.heapify(heap)
    while heap and len(b.state.host.free_pages) < num_pages:
        _, node_id = heapq.heappop(heap)
        record = b.state.host.evicted[node_id]
        b.emit(HostFree((node_id,)))
        parent = record.parent
        host = b.state.host
        if parent in host.evicted and not host.host_children(parent):
            heapq.heappush(heap, (host.evicted[parent].last_access, parent))


def plan_backup(b: Builder, node_id: int) -> bool:
    """Back up ``node_id`` and every ancestor without a copy (top down); False if no room.

    Emits ``HostFree`` for room, then one ``Offload`` per node.
    """
    state = b.state
    if node_id == ROOT or node_id in state.host.backup:
        return True
    chain = [n for n in path_to_root(state.nodes, node_id) if n not in state.host.backup]
    chain.reverse()
    needed = sum(len(state.nodes[n].pages) for n in chain)
    plan_host_evict(b, needed)
    if len(b.state.host.free_pages) < needed:
        return False
    for node in chain:
        count = len(b.state.nodes[node].pages)
        b.emit(Offload(node, tuple(b.state.host.free_pages.head(count))))
    return True


# -- device eviction and allocation ---------------------------------------------------------
def plan_evict_tiered(b: Builder, num_tokens: int, *, policy: str, at_head: bool) -> int:
    """Evict at least ``num_tokens`` device tokens; write-back stages victims to host first.

    Emits the backups' events, then one ``Evict``.
    """
    _check_policy(policy)
    order = eviction_order(b.state, num_tokens) if num_tokens > 0 else []
    if not order:
        return 0
    return _evict_order(b, order, policy=policy, at_head=at_head)


def _evict_order(b: Builder, order: list[int], *, policy: str, at_head: bool) -> int:
    if policy == WRITE_BACK:
        for node_id in order:
            plan_backup(b, node_id)
    nodes = b.state.nodes
    evicted = sum(len(nodes[n].key) for n in order)
    b.emit(Evict(tuple(order), at_head))
    return evicted


def ensure_free_pages(b: Builder, pages: int, *, policy: str, at_head: bool) -> bool:
    """Evict the device deficit when that covers it; False, emitting nothing, when it cannot."""
    state = b.state
    available = len(state.free_pages)
    if pages <= available:
        return True
    order = eviction_order(state, (pages - available) * state.geometry.page_size)
    if available + freed_pages(state, order) < pages:
        return False
    _evict_order(b, order, policy=policy, at_head=at_head)
    return True


def plan_extend_tiered(b: Builder, items: Sequence[tuple[RequestId, int]], *, policy: str,
                       at_head: bool) -> list[list[int]] | None:
    """``plan_extend`` after evicting the deficit under the host policy (``None``: no event)."""
    _check_policy(policy)
    state = b.state
    size = state.geometry.page_size
    needed = sum(new_pages_for_extend(size, state.requests[r].allocated, n) for r, n in items)
    if not ensure_free_pages(b, needed, policy=policy, at_head=at_head):
        return None
    return plan_extend(b, items, at_head=at_head)


# -- match / insert with load-back ----------------------------------------------------------
def _host_hit(state: Any, key: Sequence[int], matched: MatchResult) -> int | None:
    rest = tuple(key[matched.length:])
    size = state.geometry.page_size
    if len(rest) < size or not rest:
        return None
    child_key = state.geometry.child_key(rest)
    return state.host.evicted_children.get((matched.last_node, child_key))  # type: ignore[no-any-return]


def load_prefix(b: Builder, key: Sequence[int], *, policy: str, at_head: bool) -> MatchResult:
    """Match ``key``, loading host-only nodes on the path back to the device (all or as many fit).

    Emits the match's ``Touch``/``Split``, and per loaded node ``Lock``, the
    eviction that makes room, ``Unlock`` and ``Load``.
    """
    while True:
        matched = plan_match(b, key)
        hit = _host_hit(b.state, key, matched)
        if hit is None:
            return matched
        record = b.state.host.evicted[hit]
        need = len(record.key) // b.state.geometry.page_size
        locked = matched.last_node != ROOT
        if locked:
            b.emit(Lock(matched.last_node))  # keep the parent on the device while evicting
        room = ensure_free_pages(b, need, policy=policy, at_head=at_head)
        if locked:
            b.emit(Unlock(matched.last_node))
        if not room:
            return matched
        if hit not in b.state.host.evicted:  # making room dropped it from the host: re-match
            continue
        pages = b.state.free_pages.head(need)
        b.emit(Load(hit, tuple(pages), b.state.clock + 1))


def drop_host_subtree(b: Builder, node_id: int) -> None:
    """Drop host-only ``node_id`` and every host-only node below it (leaves first): ``HostFree``."""
    order: list[int] = []
    stack = [node_id]
    while stack:
        current = stack.pop()
        order.append(current)
        stack.extend(b.state.host.host_children(current))
    b.emit(HostFree(tuple(reversed(order))))


def _make_way_for_insert(b: Builder, key: Sequence[int], *, policy: str, at_head: bool) -> None:
    """Load host hits on ``key``; a host-only node that could not be loaded is dropped.

    The caller is about to insert its own copy of those tokens, so the host
    copy is redundant (one key, one node).
    """
    matched = load_prefix(b, key, policy=policy, at_head=at_head)
    hit = _host_hit(b.state, key, matched)
    if hit is not None:
        drop_host_subtree(b, hit)


def plan_match_tiered(b: Builder, key: Sequence[int], *, policy: str, at_head: bool) -> MatchResult:
    """``plan_match`` that loads host hits back first (a hit on a host-only node is a hit)."""
    _check_policy(policy)
    return load_prefix(b, key, policy=policy, at_head=at_head)


def plan_insert_tiered(b: Builder, key: Sequence[int], slots: Sequence[int], owner: RequestId, *,
                       policy: str, at_head: bool) -> InsertResult:
    """Insert after loading host hits; write-through backs the new leaf up."""
    _check_policy(policy)
    _make_way_for_insert(b, key, policy=policy, at_head=at_head)
    result = plan_insert(b, key, slots, owner)
    if policy == WRITE_THROUGH:
        plan_backup(b, result.last_node)
    return result


def plan_checkpoint_tiered(b: Builder, cursor: RequestCursor, token_ids: Sequence[int], *,
                           prompt_len: int, up_to: int, policy: str,
                           at_head: bool) -> RequestCursor:
    """SGLang's checkpoint with host hits loaded first; write-through backs up what it inserts."""
    _check_policy(policy)
    size = b.state.geometry.page_size
    aligned = up_to // size * size
    _make_way_for_insert(b, token_ids[:aligned], policy=policy, at_head=at_head)
    if cursor.last_node != ROOT and cursor.last_node not in b.state.nodes:
        raise ValueError(f"request {cursor.request!r} lost its locked node")  # pragma: no cover
    result = plan_checkpoint(b, cursor, token_ids, prompt_len=prompt_len, up_to=up_to,
                             at_head=at_head)
    if policy == WRITE_THROUGH and result.last_node != ROOT:
        plan_backup(b, result.last_node)
    return result
