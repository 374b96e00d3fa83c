"""Candidate fact events for the event-level search (policy-free).

``candidate_events(state, scope)`` lists, in a deterministic order, events a
caller could emit in ``state``: every free row, free page, DETACHED page,
held page, node and split point the scope allows.  Candidates may be
illegal; the explorer applies each one to both the reducer and the spec model
and requires them to agree on acceptance.  Times are always ``clock + 1``
(legality depends only on ``time >= clock``), keys are drawn from the scope's
vocabulary, and a whole key is backed by whole pages.  Pure; iterates only
sorted collections, so paths of event indices are reproducible.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import product

from kvstate import events as ev
from kvstate.checking.scopes import Scope
from kvstate.state import DETACHED, ROOT, RequestId, State


def _page_slots(page: int, size: int) -> tuple[int, ...]:
    return tuple(page * size + k for k in range(size))


def _keys(scope: Scope, num_pages: int) -> Iterator[tuple[int, ...]]:
    yield from product(range(1, scope.vocab + 1), repeat=num_pages * scope.page_size)


def candidate_events(state: State, scope: Scope) -> Iterator[ev.Event]:
    if state.geometry.mode == "block":
        from kvstate.checking.enabled_extra import block_candidates

        yield from block_candidates(state, scope)
        return
    kinds = set(scope.kinds)
    size = state.geometry.page_size
    free = sorted(state.free_pages)
    detached = sorted(p for p, h in state.holders.items() if h == (DETACHED,))
    requests = sorted(state.requests.items(), key=lambda kv: str(kv[0]))
    node_ids = sorted(n for n in state.nodes.keys() if n != ROOT)
    clock = state.clock + 1

    if "rows" in kinds:
        for row in sorted(state.free_rows):
            yield ev.ReqAlloc((row,))
        for rid, _ in requests:
            yield ev.ReqFree((rid,))
    if "allocate" in kinds:
        for page in free:
            yield ev.Allocate((page,))
        for rid, record in requests:
            position = record.allocated
            if position % size:
                last = record.pages[-1] * size + position % size
                yield ev.Allocate((), ((rid, (last,)),))
            else:
                for page in free:
                    yield ev.Allocate((page,), ((rid, (page * size,)),))
                    if size > 1:
                        yield ev.Allocate((page,), ((rid, _page_slots(page, size)),))
    if "append" in kinds:
        for rid, record in requests:
            if record.committed < record.allocated:
                yield ev.Append(((rid, record.allocated),))
    if "assign" in kinds:
        for rid, record in requests:
            if record.allocated % size == 0:
                for page in detached:
                    yield ev.Assign(rid, record.allocated, _page_slots(page, size))
            if record.allocated == 0:
                for nid in node_ids:
                    path = list(reversed(list(state.path_to_root(nid))))
                    slots = tuple(s for n in path for p in state.nodes[n].pages
                                  for s in _page_slots(p, size))
                    yield ev.Assign(rid, 0, slots)
    if "share" in kinds:
        held = sorted(p for p in set(state.holders.keys()) | set(state.page_node.keys())
                      if state.holders.get(p) != (DETACHED,))
        for rid, record in requests:
            if record.allocated % size == 0:
                for page in held:
                    yield ev.Share(rid, record.allocated, _page_slots(page, size))
    if "truncate" in kinds:
        for rid, record in requests:
            for length in sorted({0, record.allocated - 1, (record.allocated - 1) // size * size}):
                if 0 <= length < record.allocated:
                    yield ev.Truncate(rid, length)
    if "free" in kinds:
        for page in detached:
            yield ev.Free((page,), False)
            yield ev.Free((page,), True)
    if "copy" in kinds:
        sources = sorted(set(state.holders.keys()) | set(state.page_node.keys()))
        for src in sources[:1]:
            for dst in detached:
                if dst != src:
                    yield ev.Copy((src,), (dst,))
    if "insert" in kinds:
        yield from _inserts(state, scope, requests, detached, clock)
    if "split" in kinds:
        for nid in node_ids:
            key_len = len(state.nodes[nid].key)
            for at in range(size, key_len, size):
                yield ev.Split(nid, at, state.next_node_id, clock)
    if "touch" in kinds:
        for nid in node_ids:
            yield ev.Touch((nid,), clock)
    if "lock" in kinds:
        for nid in node_ids:
            yield ev.Lock(nid)
            yield ev.Unlock(nid)  # rejected unless the node holds a lock of its own
    if "evict" in kinds:
        for nid in node_ids:
            node = state.nodes[nid]
            yield ev.Evict((nid,), False)  # rejected while locked or not a leaf
            if node.lock_ref == 0 and not node.children:
                yield ev.Evict((nid,), True)
    if "reset" in kinds:
        for scope_name in ("tree", "rows", "pages", "all"):
            yield ev.Reset(scope_name)
    if kinds & {"scatter", "free_mapped", "offload", "load", "host_free"}:
        from kvstate.checking.enabled_extra import extra_candidates

        yield from extra_candidates(state, scope, requests, detached, clock)
    if state.swa is not None or state.mamba is not None:
        from kvstate.checking.enabled_hybrid import HYBRID_KINDS, hybrid_candidates

        if kinds & HYBRID_KINDS:
            yield from hybrid_candidates(state, scope)


def _inserts(state: State, scope: Scope, requests: list, detached: list[int],
             clock: int) -> Iterator[ev.Event]:
    """Insert runs of whole pages an owner holds (a request's own pages in table order, or
    DETACHED pages in id order) under every node, with every key of that many pages."""
    size = state.geometry.page_size
    runs: list[tuple[RequestId, tuple[int, ...]]] = []
    for count in range(1, scope.max_key_pages + 1):
        for start in range(0, len(detached) - count + 1):
            runs.append((DETACHED, tuple(detached[start:start + count])))
    for rid, record in requests:
        own = [p for p in record.pages[: record.allocated // size]
               if state.holders.get(p, ()) == (rid,) and p not in state.page_node]
        for count in range(1, scope.max_key_pages + 1):
            for start in range(0, len(own) - count + 1):
                runs.append((rid, tuple(own[start:start + count])))
    parents = [ROOT] + sorted(n for n in state.nodes.keys() if n != ROOT)
    for owner, pages in runs:
        slots = tuple(s for p in pages for s in _page_slots(p, size))
        for parent in parents:
            taken = set(state.nodes[parent].children.keys())
            for key in _keys(scope, len(pages)):
                if state.geometry.child_key(key) in taken:
                    continue
                yield ev.Insert(parent, key, slots, state.next_node_id, clock, owner)
