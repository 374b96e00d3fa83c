"""Alternative cache models the ``fig9`` command compares with FAST'25 Fig. 9.

``vllm_free_queue`` (vLLM V1's block pool) and ``flat_lru`` (LRU over blocks
with no trie).  The leaf-LRU candidates are ``policies.leaf_lru`` itself, with
its keyword-only cost, output reservation, measured prefix and reject-larger
knobs.  Each reads the trace without mutating it, owns its cache state locally
and returns a fresh ``Outcome``.
"""

from __future__ import annotations

from collections import OrderedDict

from .trie import MOONCAKE_BLOCK, BlockTrace, Outcome, _Tally


def vllm_free_queue(
    trace: BlockTrace, capacity: int, warmup: float = 0.0, block: int = MOONCAKE_BLOCK
) -> Outcome:
    """vLLM V1's pool, one request at a time, prompt only (no decode).

    Only full blocks are cached; the lookup takes the first cached copy of each
    block and stops at the first miss, at most ``(prompt - 1) // block`` blocks;
    allocation pops the free-queue head (evicting a cached block there); a
    request frees tail first, cached blocks to the queue tail, uncached (partial)
    ones to the head.  A recomputed block becomes one more cached copy.
    """
    free: OrderedDict[int, None] = OrderedDict((page, None) for page in range(capacity))
    refs: dict[int, int] = {}
    copies: dict[int, list[int]] = {}
    page_node: dict[int, int] = {}
    evicted = 0
    tally = _Tally(trace, warmup)
    for index, (path, counts) in enumerate(zip(trace.nodes, trace.tokens, strict=True)):
        full = 0
        while full < len(counts) and counts[full] == block:
            full += 1
        hits: list[int] = []
        for node in path[: min(full, (sum(counts) - 1) // block)]:
            found = copies.get(node)
            if not found:
                break
            hits.append(found[0])
        tally.add(index, counts, len(hits))
        new = len(path) - len(hits)
        if new + sum(1 for page in hits if not refs.get(page)) > len(free):
            continue  # larger than the pool
        for page in hits:
            if not refs.get(page):
                del free[page]
            refs[page] = refs.get(page, 0) + 1
        table = list(hits)
        for _ in range(new):
            page, _unused = free.popitem(last=False)
            node = page_node.pop(page, None)
            if node is not None:
                copies[node].remove(page)
                evicted += 1
            refs[page] = 1
            table.append(page)
        for position in range(len(hits), full):
            copies.setdefault(path[position], []).append(table[position])
            page_node[table[position]] = path[position]
        heads: list[int] = []
        for page in reversed(table):
            refs[page] -= 1
            if refs[page] == 0:
                if page in page_node:
                    free[page] = None
                else:
                    heads.append(page)
        for page in reversed(heads):
            free[page] = None
            free.move_to_end(page, last=False)
    return tally.outcome("vllm", capacity, warmup, evicted_blocks=evicted)


def flat_lru(trace: BlockTrace, capacity: int, warmup: float = 0.0, any_position: bool = False) -> Outcome:
    """A block store with plain LRU over blocks (no trie: an interior block can go).

    Every block of a request is touched (or put) root to leaf after the lookup.
    ``any_position`` counts every cached block of the request as a hit, not
    only the contiguous prefix.
    """
    cache: OrderedDict[int, None] = OrderedDict()
    evicted = 0
    tally = _Tally(trace, warmup)
    for index, (path, counts) in enumerate(zip(trace.nodes, trace.tokens, strict=True)):
        if any_position:
            present = [position for position, node in enumerate(path) if node in cache]
            tally.add_hits(index, counts, sum(counts[p] for p in present), len(present))
        else:
            matched = 0
            while matched < len(path) and path[matched] in cache:
                matched += 1
            tally.add(index, counts, matched)
        for node in path:
            if node in cache:
                cache.move_to_end(node)
                continue
            if len(cache) >= capacity:
                cache.popitem(last=False)
                evicted += 1
            cache[node] = None
    return tally.outcome("flat-lru", capacity, warmup, evicted_blocks=evicted)
