"""The three base policies over a ``BlockTrace``: infinite cache, leaf-only LRU, FIFO.

Each function reads the trace (never mutates it), keeps its own cache state
locally and returns a fresh ``Outcome``.  The exact rules are in the package
docstring (``tools/trace_ref/__init__.py``).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from .trie import BlockTrace, Outcome, _Tally


def infinite(trace: BlockTrace, warmup: float = 0.0) -> Outcome:
    """Every block ever inserted stays cached."""
    cached = bytearray(len(trace.parent))
    tally = _Tally(trace, warmup)
    for index, (path, counts) in enumerate(zip(trace.nodes, trace.tokens, strict=True)):
        matched = 0
        while matched < len(path) and cached[path[matched]]:
            matched += 1
        tally.add(index, counts, matched)
        for node in path[matched:]:
            cached[node] = 1
    return tally.outcome("infinite", None, warmup)


def leaf_lru(
    trace: BlockTrace,
    capacity: int,
    warmup: float = 0.0,
    require_full: bool = False,
    *,
    cost: Sequence[int] | None = None,
    reserve: Sequence[int] | None = None,
    measured: Sequence[int] | None = None,
    reject_larger: bool = False,
) -> Outcome:
    """Leaf-only LRU over the block trie (see the module docstring for the exact rules).

    Four knobs, all off by default, serve the ``fig9`` candidates:

    ``cost[node]``: room a cached block takes (default 1; token-charged capacity
    passes the block's tokens).  ``reserve[i]``: room request ``i``'s output
    takes while it runs; leaves are evicted for it (the request's own path is
    pinned) and the room is given back when it ends.  ``measured[i]``: only the
    first ``measured[i]`` blocks of request ``i`` are measured (the rest are
    private output blocks that take room but never hit).  ``reject_larger``:
    a request with more blocks than ``capacity`` is looked up (and its hit
    touched) but inserts nothing, as a serving engine that cannot hold the
    whole prompt refuses it; by default the prefix that fits is inserted.  ``require_full``: stop and
    flag the outcome underfilled if the cache never filled during the warmup.
    """
    size = len(trace.parent)
    cached = bytearray(size)
    cached[0] = 1
    cached_children = [0] * size
    stamp = [0] * size  # last-use tick; the heap holds (tick, node) and is checked lazily
    pinned_by = [-1] * size
    leaves: list[tuple[int, int]] = []
    tick = used = evicted = 0
    filled = False
    tally = _Tally(trace, warmup)

    def use(node: int) -> None:
        nonlocal tick
        tick += 1
        stamp[node] = tick
        if cached_children[node] == 0:
            heapq.heappush(leaves, (tick, node))

    def evict_one(request: int) -> bool:
        nonlocal used, evicted
        held: list[tuple[int, int]] = []
        victim = -1
        while leaves:
            when, node = heapq.heappop(leaves)
            if not cached[node] or cached_children[node] or stamp[node] != when:
                continue  # stale entry
            if pinned_by[node] == request:
                held.append((when, node))
                continue
            victim = node
            break
        for entry in held:
            heapq.heappush(leaves, entry)
        if victim < 0:
            return False
        cached[victim] = 0
        used -= 1 if cost is None else cost[victim]
        evicted += 1
        up = trace.parent[victim]
        cached_children[up] -= 1
        if up and cached_children[up] == 0:
            heapq.heappush(leaves, (stamp[up], up))
        return True

    for index, (path, counts) in enumerate(zip(trace.nodes, trace.tokens, strict=True)):
        if require_full and index == tally.first and not filled:
            return tally.outcome("lru", capacity, warmup, evicted_blocks=evicted, underfilled=True)
        limit = len(path) if measured is None else measured[index]
        matched = 0
        while matched < len(path) and cached[path[matched]]:
            matched += 1
        tally.add(index, counts[:limit], min(matched, limit))
        for node in path[:matched]:
            use(node)
            pinned_by[node] = index
        if reject_larger and len(path) > capacity:
            continue
        for node in path[matched:]:
            weight = 1 if cost is None else cost[node]
            while used + weight > capacity and evict_one(index):
                pass
            up = trace.parent[node]
            if used + weight > capacity or not cached[up]:
                break
            cached[node] = 1
            used += weight
            if up:
                cached_children[up] += 1
            use(node)
            if index < tally.first and used >= capacity:
                filled = True
        if index < tally.first and used >= capacity:
            filled = True
        if reserve is not None and reserve[index]:
            for node in path:
                pinned_by[node] = index
            while used + reserve[index] > capacity and evict_one(index):
                pass
    underfilled = require_full and not filled
    return tally.outcome("lru", capacity, warmup, evicted_blocks=evicted, underfilled=underfilled)


def fifo(trace: BlockTrace, capacity: int, warmup: float = 0.0, require_full: bool = False) -> Outcome:
    """Evict the block inserted longest ago, whatever its place in the trie."""
    cached = bytearray(len(trace.parent))
    order: list[int] = []
    head = used = evicted = 0
    filled = False
    tally = _Tally(trace, warmup)
    for index, (path, counts) in enumerate(zip(trace.nodes, trace.tokens, strict=True)):
        if require_full and index == tally.first and not filled:
            return tally.outcome("fifo", capacity, warmup, evicted_blocks=evicted, underfilled=True)
        matched = 0
        while matched < len(path) and cached[path[matched]]:
            matched += 1
        tally.add(index, counts, matched)
        for node in path:
            if cached[node]:
                continue
            while used >= capacity and head < len(order):
                victim = order[head]
                head += 1
                if cached[victim]:
                    cached[victim] = 0
                    used -= 1
                    evicted += 1
            if used >= capacity:
                break
            cached[node] = 1
            used += 1
            order.append(node)
            if used >= capacity and index < tally.first:
                filled = True
    underfilled = require_full and not filled
    return tally.outcome("fifo", capacity, warmup, evicted_blocks=evicted, underfilled=underfilled)
