"""State fingerprints for the explorer: what counts as "the same state".

Three views, all 128-bit blake2b digests of a msgpack encoding:

``plain_view``
    The core's own fingerprint (``State.fingerprint``): every field that decides
    future behaviour, ids and times as they are.

``event_view`` (event level, symmetry on)
    Canonical up to renaming of request rows, pages, node ids and times.  At
    the event level this is sound: every candidate event is generated for
    every free row, free or held page and node, times are ``clock + 1``, and
    the reducer only compares times with the clock.  So two states that are a
    renaming of each other have renamed successor sets, and every property in
    ``specs.invariants`` is invariant under renaming (row 0 and page 0 are
    never renamed to or from).  The free-list and free-row *order* is also
    dropped: no event's legality depends on it.  Each table keeps its dangling
    entries (indices, which renaming does not touch).  Block-mode and host-tier
    states are not reduced (``Scope`` refuses symmetry there: block allocation
    and the host candidates take the head of a free list).  Row generations are dropped
    (they count reuse and affect nothing).  The renaming is computed by a
    deterministic traversal (tree in child-key order, then requests sorted by
    content), so equal views always mean symmetric states; symmetric states
    may still get different views (the reduction is not maximal).

``planner_view`` (planner level)
    No page or row renaming: the planner takes the head of the free list and
    of the row stack, so order and identity matter.  Only times and node ids
    are compressed *order-preservingly* (LRU and FIFO priorities compare them)
    and row generations are dropped.

Pure functions of their arguments.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack

from kvstate.state import DETACHED, ROOT, State


def digest(obj: Any) -> bytes:
    return hashlib.blake2b(msgpack.packb(obj, use_bin_type=True), digest_size=16).digest()


def plain_view(state: State) -> bytes:
    return state.fingerprint()


def _tree_order(state: State) -> list[int]:
    nodes = state.nodes
    order: list[int] = []
    stack = [ROOT]
    while stack:
        node_id = stack.pop()
        order.append(node_id)
        children = nodes[node_id].children
        stack.extend(child for _, child in sorted(children.items(), reverse=True))
    return order


def event_view(state: State) -> bytes:
    nodes = state.nodes
    order = _tree_order(state)
    node_label = {node_id: index for index, node_id in enumerate(order)}
    times = sorted({state.clock, *(nodes[n].last_access for n in order)})
    time_rank = {t: i for i, t in enumerate(times)}
    page_label: dict[int, int] = {}
    for node_id in order:
        for page in nodes[node_id].pages:
            page_label[page] = len(page_label) + 1
    holders = state.holders

    def signature(item: tuple[Any, Any]) -> tuple[Any, ...]:
        rid, record = item
        pages = tuple(page_label.get(p, 0) for p in record.pages)
        shared = tuple(len(holders.get(p, ())) for p in record.pages)
        return (record.allocated, record.committed, pages, shared, tuple(record.dangling), str(rid))

    requests = sorted(state.requests.items(), key=signature)
    request_label = {rid: index + 1 for index, (rid, _) in enumerate(requests)}
    for _, record in requests:
        for page in record.pages:
            if page not in page_label:
                page_label[page] = len(page_label) + 1
    detached = 0
    held = []
    for page, who in holders.items():
        if who == (DETACHED,) and page not in page_label:
            detached += 1
            continue
        label = page_label.setdefault(page, len(page_label) + 1)
        held.append((label, sorted(request_label.get(h, 0) for h in who)))
    held.sort()
    tree = [[node_label.get(nodes[n].parent, -1), list(nodes[n].key),
             [page_label[p] for p in nodes[n].pages], nodes[n].lock_ref,
             time_rank[nodes[n].last_access]] for n in order]
    tables = [[r.allocated, r.committed, [page_label.get(p, 0) for p in r.pages], list(r.dangling)]
              for _, r in requests]
    return digest([tree, tables, held, detached, len(state.free_pages), len(state.free_rows),
                   time_rank[state.clock]])


def planner_view(state: State, extra: Any = None, node_fields: tuple[int, ...] = ()) -> bytes:
    """``extra`` is front-end data (cursors); its node ids are listed in ``node_fields``."""
    nodes = state.nodes
    ids = sorted(nodes.keys())
    node_rank = {n: i for i, n in enumerate(ids)}
    times = sorted({state.clock, *(node.last_access for node in nodes.values())})
    time_rank = {t: i for i, t in enumerate(times)}
    tree = []
    for node_id in ids:
        node = nodes[node_id]
        children = sorted((node_rank[c], list(k) if isinstance(k, tuple) else k)
                          for k, c in node.children.items())
        tree.append([node_rank.get(node.parent, -1), list(node.key), list(node.pages),
                     node.lock_ref, time_rank[node.last_access], children])
    held = sorted((page, sorted(who, key=str)) for page, who in state.holders.items())
    tables = [[str(rid), list(r.pages), r.allocated, r.committed]
              for rid, r in sorted(state.requests.items(), key=lambda kv: str(kv[0]))]
    mapped_extra = [node_rank.get(n, n) for n in node_fields]
    return digest([tree, held, tables, list(state.free_pages), list(state.free_rows),
                   state.evictable_size, state.protected_size, time_rank[state.clock],
                   extra, mapped_extra])
