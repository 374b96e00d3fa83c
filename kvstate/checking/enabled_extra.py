"""Candidate events of the newer kinds: SGLang's row writes, the host tier, the block pool.

Like ``kvstate.checking.enabled`` (which calls these only for scopes that
enable the kinds, so the pinned scopes keep their exact candidate lists):
deterministic order, candidates may be illegal, times are ``clock + 1``.

* ``scatter``: one-slot writes at each request's end or over a dangling
  entry, alone and for every pair of requests (two rows writing the same
  page in one batch must be refused: finding F6);
* ``free_mapped``: every page held by a request (legal only when it holds it
  alone, outside the tree);
* ``offload`` / ``load`` / ``host_free``: every node, with the head of the
  free host (or device) pages, both free-list ends;
* block mode: every holder (the pool and each request) with the head of the
  free queue, every page, every cached copy, one- and two-entry cache chains
  (a hollow node, a null block) with and without an extra key.

Pure; iterates only sorted collections.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import combinations, product
from typing import Any

from kvstate import events as ev
from kvstate.checking.scopes import Scope
from kvstate.state import DETACHED, ROOT, block_child_key

EXTRA_KEY = (("salt", "s"),)  # one tagged extra key (vLLM cache salt) for block chains
BLOCK_NAMES = ("a", "b")  # the request names a block-mode scope opens


def _write_options(state: Any, rid: Any, record: Any, detached: list[int]) -> list[tuple]:
    """One-slot writes a decode step could scatter for ``rid``: its next position, and a
    rewrite of each dangling entry."""
    size = state.geometry.page_size
    position = record.allocated
    out: list[tuple] = []
    if position < state.geometry.row_width:
        if position % size:
            out.append((rid, position, record.pages[-1] * size + position % size))
        else:
            out.extend((rid, position, page * size) for page in detached)
    for index in record.dangling:
        out.extend((rid, index * size, page * size) for page in detached)
    return out


def extra_candidates(state: Any, scope: Scope, requests: list, detached: list[int],
                     clock: int) -> Iterator[ev.Event]:
    kinds = set(scope.kinds)
    if "scatter" in kinds:
        options = [_write_options(state, rid, record, detached) for rid, record in requests]
        for writes in options:
            for item in writes:
                yield ev.Scatter((item,))
        for first, second in combinations(options, 2):
            for pair in product(first, second):  # same-page pairs must be refused (F6)
                yield ev.Scatter(pair)
    if "free_mapped" in kinds:
        for page in sorted(p for p, held in state.holders.items() if held != (DETACHED,)):
            yield ev.FreeMapped((page,), False)
            yield ev.FreeMapped((page,), True)
    host = state.host
    if host is None:
        return
    node_ids = sorted(n for n in state.nodes.keys() if n != ROOT)
    if "offload" in kinds:
        for node_id in node_ids:
            count = len(state.nodes[node_id].pages)
            yield ev.Offload(node_id, tuple(host.free_pages.head(count)))
    if "load" in kinds:
        for node_id in sorted(host.evicted.keys()):
            count = len(host.evicted[node_id].key) // state.geometry.page_size
            yield ev.Load(node_id, tuple(state.free_pages.head(count)), clock)
    if "host_free" in kinds:
        for node_id in sorted(host.backup.keys()):
            yield ev.HostFree((node_id,), False)
            yield ev.HostFree((node_id,), True)


def block_candidates(state: Any, scope: Scope) -> Iterator[ev.Event]:
    kinds = set(scope.kinds)
    size = state.geometry.page_size
    requests = sorted(state.requests.items(), key=lambda kv: str(kv[0]))
    holders: list[Any] = [DETACHED] + [rid for rid, _ in requests]
    pages = range(1, state.geometry.num_pages + 1)
    if "rows" in kinds:  # vLLM names its requests and closes them with BlockRelease(close=True)
        for name in BLOCK_NAMES:  # (ReqFree in block mode: finding F7's regression test)
            if name not in state.requests:
                yield ev.ReqAlloc((name,))
    if "block_alloc" in kinds:
        for holder in holders:
            yield ev.BlockAlloc(holder, tuple(state.free_pages.head(1)))
            if size == 1:
                yield ev.BlockAlloc(holder, tuple(state.free_pages.head(2)))
    if "block_hold" in kinds:
        for holder in holders:
            for page in pages:
                yield ev.BlockHold(holder, (page,))
            if holder != DETACHED:
                yield ev.BlockHold(holder, (0,))  # a null block pads the table
    if "block_release" in kinds:
        for holder in holders:
            for page in sorted(p for p, held in state.holders.items() if holder in held):
                yield ev.BlockRelease(holder, (page,), True, False)
                yield ev.BlockRelease(holder, (page,), False, False)
        for rid, record in requests:
            yield ev.BlockRelease(rid, tuple(p for p in record.pages if p), True, True)
    if "block_cache" in kinds:
        yield from _cache_chains(state, scope)
    if "block_uncache" in kinds:
        for page, node_id in sorted(state.page_node.items()):
            yield ev.BlockUncache((page,), (node_id,))
    if "block_clear" in kinds:
        yield ev.BlockClear()
    if "reset" in kinds:
        for scope_name in ("tree", "pages", "all"):
            yield ev.Reset(scope_name)


def _cache_chains(state: Any, scope: Scope) -> Iterator[ev.Event]:
    """Cache one held page under every node, with every key (and at the root also with an
    extra key), and a two-entry chain (a new hollow node, then the page) at the root."""
    size = state.geometry.page_size
    keys = list(product(range(1, scope.vocab + 1), repeat=size))
    held = sorted(state.holders.keys())
    nodes = state.nodes

    def child(parent: int, key: tuple[int, ...], extra: Any) -> int:
        found = nodes[parent].children.get(block_child_key(key, extra)) if parent in nodes else None
        return state.next_node_id if found is None else found

    for parent in sorted(nodes.keys()):
        extras = (None, EXTRA_KEY) if parent == ROOT else (None,)
        for key, extra in product(keys, extras):
            node_id = child(parent, key, extra)
            for page in held:
                yield ev.BlockCache(parent, ((node_id, key, extra, page),), 0)
    for first, second in product(keys, keys):
        top = child(ROOT, first, None)
        below = state.next_node_id + (1 if top == state.next_node_id else 0)
        if top != state.next_node_id:
            below = child(top, second, None)
        for page in held:
            yield ev.BlockCache(ROOT, ((top, first, None, 0), (below, second, None, page)), 1)
