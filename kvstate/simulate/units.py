"""Units: pages of 64 trace tokens, the granularity of the hybrid runs (``hybrid_driver``).

A request's unit ids are its synthetic token ids (``kvstate.traces.tokens``)
at every unit's first position, so two prompts share a unit iff they share
its tokens: the trace's blocks are whole units, and a partial last block is
its own, shorter unit (weighted by its tokens).  Equivalent to token
granularity with 64-token pages, with keys 64 times shorter.  Pure.
"""

from __future__ import annotations

import math

from kvstate.traces.records import TraceRequest
from kvstate.traces.tokens import full_block_tokens, partial_block_tokens, private_tokens

UNIT_TOKENS = 64


def unit_size(block_size: int) -> int:
    """Tokens per unit for a trace of ``block_size``-token hash blocks (a divisor of both)."""
    return math.gcd(UNIT_TOKENS, block_size) if block_size > 0 else UNIT_TOKENS


def units_of(tokens: int, unit: int) -> int:
    return -(-tokens // unit)


def unit_key(request: TraceRequest, unit: int) -> tuple[list[int], list[int]]:
    """The request's unit ids (its token id at each unit's first position) and their tokens."""
    ids: list[int] = []
    weights: list[int] = []
    size = request.block_size
    for key, count in zip(request.block_keys, request.block_token_counts, strict=True):
        tokens = full_block_tokens(key, size) if count == size else partial_block_tokens(key, size, count)
        for offset in range(0, count, unit):
            ids.append(tokens[offset])
            weights.append(min(unit, count - offset))
    if request.private_tail:
        tail = private_tokens(request.sequence, request.private_tail)
        for offset in range(0, request.private_tail, unit):
            ids.append(tail[offset])
            weights.append(min(unit, request.private_tail - offset))
    return ids, weights


__all__ = ["UNIT_TOKENS", "unit_key", "unit_size", "units_of"]
