"""Rules of the SWA pool: pair, free, tombstone, publish, stamp, window-lock, recover.

Ownership of an SWA page (``State.swa``)::

    SWA page 0        the padding page, never used
    SWA pages 1..M    exactly one of
                        free      in ``swa.free_pages`` (queue order = reuse order)
                        the peer  of one allocated FULL page (``swa.peer[full] = swa``)

A tree node's SWA component is *live* exactly when all its FULL pages have
peers, and a *tombstone* when none has.  Window locks (``Node.swa.lock_ref``)
never exceed a node's FULL ``lock_ref`` (a request's FULL lock covers its
whole path, its SWA lock only the last window of it).  Every rule checks all
its preconditions before its first write (``kvstate.rules``).  Recovering a
tombstone from a request's slots is in ``kvstate.rules.swa_recover``.
"""

from __future__ import annotations

from typing import Any

from kvstate.events import SwaAlloc, SwaEvict, SwaFree, SwaLock, SwaPublish, SwaTouch, SwaUnlock
from kvstate.records import SwaNode
from kvstate.rules.common import check_distinct, check_page_id, check_time
from kvstate.rules.registry import Reject, rule
from kvstate.state import ROOT


def pool_of(s: Any) -> Any:
    pool = s.swa
    if pool is None:
        raise Reject("this cache has no SWA pool")
    return pool


def swa_node(s: Any, node_id: int) -> tuple[Any, SwaNode]:
    """A non-root tree node and its SWA component."""
    node = s.nodes.get(node_id)
    if node is None or node_id == ROOT:
        raise Reject(f"unknown tree node {node_id}" if node is None else "the root has no SWA")
    if node.swa is None:
        raise Reject(f"node {node_id} has no SWA component")
    return node, node.swa


def credit(pool: Any, swa: SwaNode, tokens: int) -> None:
    """Count a node's tokens of newly live SWA as protected (window-locked) or evictable."""
    if swa.lock_ref > 0:
        pool.protected += tokens
    else:
        pool.evictable += tokens


def _push(pool: Any, pages: list[int], at_head: bool) -> None:
    queue = pool.free_pages
    pool.free_pages = queue.push_head(pages) if at_head else queue.push_tail(pages)


@rule(SwaAlloc)
def swa_alloc(s: Any, event: SwaAlloc) -> None:
    pool = pool_of(s)
    check_distinct([full for full, _ in event.pairs], "FULL page")
    check_distinct([page for _, page in event.pairs], "SWA page")
    peer, queue, holders, page_node = pool.peer, pool.free_pages, s.holders, s.page_node
    for full, page in event.pairs:
        check_page_id(s, full)
        if full in page_node:
            raise Reject(f"FULL page {full} is in tree node {page_node[full]}")
        if full not in holders:
            raise Reject(f"FULL page {full} is free (pair only allocated pages)")
        if full in peer:
            raise Reject(f"FULL page {full} already has SWA page {peer[full]}")
        if page not in queue:
            if not 1 <= page <= pool.num_pages:
                raise Reject(f"SWA page {page} is outside 1..{pool.num_pages}")
            raise Reject(f"SWA page {page} is not free")
    pool.free_pages = queue.take([page for _, page in event.pairs])
    for full, page in event.pairs:
        peer[full] = page
    if s.touched is not None:
        s.touched.pages.update(full for full, _ in event.pairs)


@rule(SwaFree)
def swa_free(s: Any, event: SwaFree) -> None:
    pool = pool_of(s)
    check_distinct(event.pages, "FULL page")
    peer, page_node = pool.peer, s.page_node
    for full in event.pages:
        if full in page_node:
            raise Reject(f"FULL page {full} is in tree node {page_node[full]}; "
                         "tombstone the node with SwaEvict")
        if full not in peer:
            check_page_id(s, full)
            raise Reject(f"FULL page {full} has no SWA page (double free)")
    _push(pool, [peer.pop(full) for full in event.pages], event.at_head)
    if s.touched is not None:
        s.touched.pages.update(event.pages)


@rule(SwaEvict)
def swa_evict(s: Any, event: SwaEvict) -> None:
    pool = pool_of(s)
    check_distinct(event.nodes, "node")
    peer = pool.peer
    for node_id in event.nodes:
        node, swa = swa_node(s, node_id)
        if not swa.live:
            raise Reject(f"node {node_id} is already an SWA tombstone")
        if swa.lock_ref:
            raise Reject(f"node {node_id} is inside an SWA window lock ({swa.lock_ref})")
        missing = [page for page in node.pages if page not in peer]
        if missing:
            raise Reject(f"live node {node_id} page {missing[0]} has no SWA page")
    for node_id in event.nodes:
        node = s.node_w(node_id)
        _push(pool, [peer.pop(page) for page in node.pages], event.at_head)
        node.swa = SwaNode(False, node.swa.lock_ref, node.swa.uuid, 0)
        pool.evictable -= len(node.key)
        if s.touched is not None:
            s.touched.pages.update(node.pages)
    if s.touched is not None:
        s.touched.nodes.update(event.nodes)


@rule(SwaPublish)
def swa_publish(s: Any, event: SwaPublish) -> None:
    pool = pool_of(s)
    check_time(s, event.time)
    node, swa = swa_node(s, event.node)
    if swa.live:
        raise Reject(f"node {event.node} is already live")
    missing = [page for page in node.pages if page not in pool.peer]
    if missing:
        raise Reject(f"node {event.node} page {missing[0]} has no SWA page to publish")
    credit(pool, swa, len(node.key))
    s.node_w(event.node).swa = SwaNode(True, swa.lock_ref, swa.uuid, event.time)
    s.clock = event.time
    if s.touched is not None:
        s.touched.nodes.add(event.node)


@rule(SwaTouch)
def swa_touch(s: Any, event: SwaTouch) -> None:
    pool_of(s)
    check_time(s, event.time)
    if not event.nodes:
        raise Reject("an SWA touch names no node")
    check_distinct(event.nodes, "node")
    nodes = s.nodes
    for index, node_id in enumerate(event.nodes):
        _, swa = swa_node(s, node_id)
        if not swa.live:
            raise Reject(f"node {node_id} is an SWA tombstone (not in the SWA LRU)")
        if index:
            _check_ancestor(nodes, event.nodes[index - 1], node_id)
    for node_id in event.nodes:
        node = s.node_w(node_id)
        swa = node.swa
        node.swa = SwaNode(swa.live, swa.lock_ref, swa.uuid, event.time)
    s.clock = event.time
    if s.touched is not None:
        s.touched.nodes.update(event.nodes)


def _check_ancestor(nodes: Any, below: int, above: int) -> None:
    node_id = nodes[below].parent
    while node_id != above:
        if node_id == ROOT:
            raise Reject(f"node {above} is not an ancestor of node {below}")
        node_id = nodes[node_id].parent


def _window(s: Any, node_id: int, stop: Any) -> list[int]:
    """Node ids from ``node_id`` upward, through the first for which ``stop`` holds
    (or up to the root); each with an SWA component."""
    path = []
    while node_id != ROOT:
        _, swa = swa_node(s, node_id)
        path.append(node_id)
        if stop(node_id, swa):
            break
        node_id = s.nodes[node_id].parent
    return path


@rule(SwaLock)
def swa_lock(s: Any, event: SwaLock) -> None:
    pool = pool_of(s)
    if event.node == ROOT:
        raise Reject("the root takes no SWA lock")
    path = _window(s, event.node, lambda node_id, _: node_id == event.top)
    if event.top != ROOT and path[-1] != event.top:
        raise Reject(f"node {event.top} is not on the path from node {event.node}")
    nodes = s.nodes
    for node_id in path:
        node = nodes[node_id]
        if node.lock_ref <= node.swa.lock_ref:
            raise Reject(f"node {node_id}: an SWA lock needs a FULL lock under it "
                         f"(FULL {node.lock_ref}, SWA {node.swa.lock_ref}); lock FULL first")
        if not node.swa.live:
            # A window lock promises the request its last W tokens' SWA KV; a tombstone
            # in the window has none (recover it first: SwaAdopt or SwaRebind).
            raise Reject(f"node {node_id} in the window is an SWA tombstone; recover it "
                         "before locking the window")
    fresh = False
    if event.top == ROOT:
        if event.uuid:
            raise Reject("a window that reaches the root has no receipt (uuid must be 0)")
    else:
        known = nodes[event.top].swa.uuid
        fresh = not known
        expected = pool.next_uuid if fresh else known
        if event.uuid != expected:
            raise Reject(f"the receipt of node {event.top} must be {expected}, got {event.uuid}")
    for node_id in path:
        node = s.node_w(node_id)
        swa = node.swa
        if swa.lock_ref == 0 and swa.live:
            pool.evictable -= len(node.key)
            pool.protected += len(node.key)
        node.swa = SwaNode(swa.live, swa.lock_ref + 1,
                           event.uuid if fresh and node_id == event.top else swa.uuid, swa.stamp)
    if fresh:
        pool.next_uuid += 1
    if s.touched is not None:
        s.touched.nodes.update(path)


@rule(SwaUnlock)
def swa_unlock(s: Any, event: SwaUnlock) -> None:
    pool = pool_of(s)
    if event.node == ROOT:
        raise Reject("the root takes no SWA lock")
    path = _window(s, event.node, lambda _, swa: bool(event.uuid) and swa.uuid == event.uuid)
    nodes = s.nodes
    if event.uuid and nodes[path[-1]].swa.uuid != event.uuid:
        raise Reject(f"receipt {event.uuid} is not on the path from node {event.node}")
    for node_id in path:
        if nodes[node_id].swa.lock_ref == 0:
            raise Reject(f"SWA unlock of node {node_id} below zero")
    for node_id in path:
        node = s.node_w(node_id)
        swa = node.swa
        if swa.lock_ref == 1 and swa.live:
            pool.evictable += len(node.key)
            pool.protected -= len(node.key)
        node.swa = SwaNode(swa.live, swa.lock_ref - 1, swa.uuid, swa.stamp)
    if s.touched is not None:
        s.touched.nodes.update(path)
