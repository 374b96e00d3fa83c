"""Derived traces and per-block costs for the Fig. 9 candidate definitions.

Every function reads its input ``BlockTrace`` without mutating it and returns
new lists or a new ``BlockTrace`` that the caller owns.
"""

from __future__ import annotations

from typing import Any

from .trie import MOONCAKE_BLOCK, BlockTrace


def block_costs(trace: BlockTrace) -> list[int]:
    """Tokens of each trie node (a partial block charges only its tokens)."""
    cost = [0] * len(trace.parent)
    for path, counts in zip(trace.nodes, trace.tokens, strict=True):
        for node, count in zip(path, counts, strict=True):
            cost[node] = count
    return cost


def split_blocks(trace: BlockTrace, piece: int) -> BlockTrace:
    """The same requests with every hash block cut into ``piece``-token sub-blocks.

    Sub-block ``j`` of a block is keyed by ``(block node, j)``, so two requests
    share a sub-block only when they share the whole hash block: the trace
    cannot say more.  What changes is granularity: a partial block takes
    ``ceil(tokens / piece)`` slots, and eviction can drop the second half of a
    block while its first half still hits.
    """
    out = BlockTrace()
    for path, counts, output in zip(trace.nodes, trace.tokens, trace.outputs, strict=True):
        ids: list[Any] = []
        pieces: list[int] = []
        for node, count in zip(path, counts, strict=True):
            for j in range(-(-count // piece)):
                ids.append((node, j))
                pieces.append(min(piece, count - piece * j))
        out.add(ids, pieces, output)
    return out


def output_blocks(trace: BlockTrace, block: int = MOONCAKE_BLOCK) -> list[int]:
    """Blocks each request's output adds beyond its prompt blocks."""
    return [
        -(-(sum(counts) + output) // block) - len(counts)
        for counts, output in zip(trace.tokens, trace.outputs, strict=True)
    ]


def with_private_outputs(trace: BlockTrace, block: int = MOONCAKE_BLOCK) -> tuple[BlockTrace, list[int]]:
    """Each request followed by its output blocks under ids no other request has."""
    out = BlockTrace()
    extra = output_blocks(trace, block)
    for index, (path, counts) in enumerate(zip(trace.nodes, trace.tokens, strict=True)):
        ids: list[Any] = [*path, *(("out", index, j) for j in range(extra[index]))]
        out.add(ids, [*counts, *([block] * extra[index])])
    return out, [len(path) for path in trace.nodes]
