"""The three base policies over a ``BlockTrace``: infinite cache, leaf-only LRU, FIFO.

Each function reads the trace (never mutates it), keeps its own cache state
locally and returns a fresh ``Outcome``.  The exact rules are in the package
docstring (``tools/trace_ref/__init__.py``).
"""

from __future__ import annotations

import heapq

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


def leaf_lru(trace: BlockTrace, capacity: int, warmup: float = 0.0, require_full: bool = False) -> Outcome:
    """Leaf-only LRU over the block trie (see the module docstring for the exact rules)."""
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
        used -= 1
        evicted += 1
        up = trace.parent[victim]
        cached_children[up] -= 1
        if up and cached_children[up] == 0:
            heapq.heappush(leaves, (stamp[up], up))
        return True

    for index, (path, counts) in enumerate(zip(trace.nodes, trace.tokens, strict=True)):
        if require_full and index == tally.first and not filled:
            return tally.outcome("lru", capacity, warmup, evicted_blocks=evicted, underfilled=True)
        matched = 0
        while matched < len(path) and cached[path[matched]]:
            matched += 1
        tally.add(index, counts, matched)
        for node in path[:matched]:
            use(node)
            pinned_by[node] = index
        for node in path[matched:]:
            if used >= capacity and not evict_one(index):
                break
            up = trace.parent[node]
            if used >= capacity or not cached[up]:
                break
            cached[node] = 1
            used += 1
            if up:
                cached_children[up] += 1
            use(node)
            if used >= capacity and index < tally.first:
                filled = True
        if index < tally.first and used >= capacity:
            filled = True
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
