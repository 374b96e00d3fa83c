"""Named invariants of the SWA pool (checked when a state has one: ``State.swa``).

Each recomputed from scratch, pure and read-only, over a frozen or a live
state.  They have their own registry (``SWA_CHECKS``): ``kvstate.invariants.
check`` runs them after the core checks on a state with an SWA pool.

* ``swa_owned_once``: every SWA page 1..M is free exactly once or the peer of
  exactly one FULL page, never both;
* ``swa_peer_held``: only allocated FULL pages (held or in the tree) have peers;
* ``swa_node_peers``: a live node's FULL pages all have peers, a tombstone's
  none; every node but the root has an SWA component;
* ``swa_full_covers_lock``: a node's SWA window locks never exceed its FULL
  locks (a request's FULL lock covers its whole path, its SWA lock one window);
* ``swa_locked_window_live``: a tombstone never sits inside a window that a
  lock needs (a window-locked node is live);
* ``swa_receipts``: window receipts are unique and below ``next_uuid``;
* ``swa_lru_total``: live nodes sharing an SWA LRU stamp lie on one root path
  (so stamp, then depth, orders the SWA LRU totally, as SGLang's list does);
* ``swa_sizes``: the pool's evictable / protected counters match the tree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from kvstate.state import ROOT

Check = Callable[[Any], Iterator[str]]
SWA_CHECKS: dict[str, Check] = {}


def _named(name: str) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        SWA_CHECKS[name] = fn
        return fn

    return register


@_named("swa_owned_once")
def _owned_once(state: Any) -> Iterator[str]:
    pool = state.swa
    owner: dict[int, int] = {}
    for full, page in pool.peer.items():
        if not 1 <= page <= pool.num_pages:
            yield f"FULL page {full} has SWA page {page}, outside 1..{pool.num_pages}"
        if page in owner:
            yield f"SWA page {page} is the peer of FULL pages {owner[page]} and {full}"
        owner[page] = full
        if page in pool.free_pages:
            yield f"SWA page {page} of FULL page {full} is also free"
    free = list(pool.free_pages)
    if len(free) != len(set(free)):
        yield "the SWA free list has a duplicate page"
    stray = [page for page in free if not 1 <= page <= pool.num_pages]
    if stray:
        yield f"SWA free pages outside 1..{pool.num_pages}: {sorted(stray)[:8]}"
    if len(set(free) | set(owner)) != pool.num_pages:
        yield "SWA pages are not partitioned into free and paired (one leaked)"


@_named("swa_peer_held")
def _peer_held(state: Any) -> Iterator[str]:
    holders, page_node = state.holders, state.page_node
    for full in state.swa.peer:
        if full not in holders and full not in page_node:
            yield f"FULL page {full} is free but keeps an SWA page"


@_named("swa_node_peers")
def _node_peers(state: Any) -> Iterator[str]:
    yield from _per_node(state, "swa_node_peers")


@_named("swa_full_covers_lock")
def _full_covers_lock(state: Any) -> Iterator[str]:
    yield from _per_node(state, "swa_full_covers_lock")


@_named("swa_locked_window_live")
def _locked_window_live(state: Any) -> Iterator[str]:
    yield from _per_node(state, "swa_locked_window_live")


def _per_node(state: Any, name: str) -> Iterator[str]:
    for node_id, node in state.nodes.items():
        for found, message in node_checks(state, node_id, node):
            if found == name:
                yield message


def node_checks(state: Any, node_id: int, node: Any) -> Iterator[tuple[str, str]]:
    """``(check name, message)`` for one node's SWA component (the incremental checks too)."""
    swa = node.swa
    if node_id == ROOT:
        if swa is not None:
            yield "swa_node_peers", "the root has an SWA component"
        return
    if swa is None:
        yield "swa_node_peers", f"node {node_id} has no SWA component"
        return
    peer = state.swa.peer
    paired = sum(1 for page in node.pages if page in peer)
    if swa.live and paired != len(node.pages):
        yield ("swa_node_peers",
               f"live node {node_id} has {len(node.pages) - paired} pages without SWA pages")
    if not swa.live and paired:
        yield "swa_node_peers", f"tombstone {node_id} still has {paired} SWA pages"
    if not swa.live and swa.stamp:
        yield "swa_node_peers", f"tombstone {node_id} keeps an SWA LRU stamp"
    if swa.lock_ref > node.lock_ref or swa.lock_ref < 0:
        yield ("swa_full_covers_lock", f"node {node_id} has {swa.lock_ref} SWA window locks "
               f"over {node.lock_ref} FULL locks")
    if swa.lock_ref and not swa.live:
        yield "swa_locked_window_live", f"tombstone {node_id} sits inside a locked SWA window"


@_named("swa_receipts")
def _receipts(state: Any) -> Iterator[str]:
    seen: dict[int, int] = {}
    limit = state.swa.next_uuid
    for node_id, node in state.nodes.items():
        uuid = 0 if node.swa is None else node.swa.uuid
        if not uuid:
            continue
        if uuid in seen:
            yield f"window receipt {uuid} is on nodes {seen[uuid]} and {node_id}"
        if uuid >= limit:
            yield f"window receipt {uuid} of node {node_id} is not below next_uuid {limit}"
        seen[uuid] = node_id


@_named("swa_lru_total")
def _lru_total(state: Any) -> Iterator[str]:
    by_stamp: dict[int, list[int]] = {}
    for node_id, node in state.nodes.items():
        if node.swa is not None and node.swa.live:
            by_stamp.setdefault(node.swa.stamp, []).append(node_id)
    nodes = state.nodes
    for stamp, group in by_stamp.items():
        if len(group) < 2:
            continue
        deepest = max(group, key=lambda n: depth(nodes, n))
        path = set(_path(nodes, deepest))
        off = [n for n in group if n not in path]
        if off:
            yield f"nodes {sorted(group)[:6]} share SWA LRU stamp {stamp} off one root path"


@_named("swa_sizes")
def _sizes(state: Any) -> Iterator[str]:
    evictable = protected = 0
    for node_id, node in state.nodes.items():
        if node_id == ROOT or node.swa is None or not node.swa.live:
            continue
        if node.swa.lock_ref:
            protected += len(node.key)
        else:
            evictable += len(node.key)
    pool = state.swa
    if (pool.evictable, pool.protected) != (evictable, protected):
        yield (f"SWA sizes say evictable {pool.evictable} / protected {pool.protected}, the tree "
               f"has {evictable} / {protected}")


def depth(nodes: Any, node_id: int) -> int:
    count = 0
    while node_id != ROOT:
        count += 1
        node_id = nodes[node_id].parent
    return count


def _path(nodes: Any, node_id: int) -> Iterator[int]:
    while node_id != ROOT:
        yield node_id
        node_id = nodes[node_id].parent


def check_swa(state: Any, names: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    """``(name, message)`` for every violation (nothing without an SWA pool)."""
    if getattr(state, "swa", None) is None:
        return []
    names = tuple(SWA_CHECKS) if names is None else names
    return [(name, message) for name in names for message in SWA_CHECKS[name](state)]
