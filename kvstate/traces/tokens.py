"""Deterministic synthetic token ids that reproduce a trace's prefix structure.

Traces carry block hashes, not text.  We turn each hashed block into token ids
computed arithmetically from the block's key and the token's offset, so the
mapping is pure, needs no randomness and no table, and is injective:

* a **full** block ``key`` (``block_size`` tokens) gets, at offset ``o``,
  ``((key * block_size + o) << 2) | 0``;
* a **partial** block ``key`` holding ``count < block_size`` tokens gets
  ``(((key * block_size + count) * block_size + o) << 2) | 1``.  Its ids depend
  on ``count``, so a partial block never shares tokens with a longer block that
  happens to carry the same key: only an identical partial block matches;
* tokens the trace does not hash (the uncovered tail of a kv-cache-tester
  request, or a whole Azure prompt) are private to the request:
  ``((ordinal << 24 | o) << 2) | 2``, where ``ordinal`` is the request's
  position in the stream.  They never match anything.

The two low bits keep the three families disjoint, and within a family the
formula is one-to-one, so two prompts share a token prefix of length ``n`` iff
their block-key sequences share the blocks covering those ``n`` tokens.
Nothing here mutates its inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

KIND_FULL = 0
KIND_PARTIAL = 1
KIND_PRIVATE = 2
PRIVATE_OFFSET_BITS = 24
MAX_PRIVATE_TOKENS = 1 << PRIVATE_OFFSET_BITS


def full_block_tokens(key: int, block_size: int) -> range:
    """Token ids of the full block ``key`` (a ``range``; no allocation)."""
    start = ((key * block_size) << 2) | KIND_FULL
    return range(start, start + (block_size << 2), 4)


def partial_block_tokens(key: int, block_size: int, count: int) -> range:
    """Token ids of block ``key`` when it holds only ``count`` (< block_size) tokens."""
    start = (((key * block_size + count) * block_size) << 2) | KIND_PARTIAL
    return range(start, start + (count << 2), 4)


def private_tokens(ordinal: int, count: int, first_offset: int = 0) -> range:
    """``count`` token ids private to the request at stream position ``ordinal``.

    ``first_offset`` lets a request place its private tail after its hashed
    blocks; offsets must stay below ``MAX_PRIVATE_TOKENS`` (the caller checks).
    """
    start = (((ordinal << PRIVATE_OFFSET_BITS) | first_offset) << 2) | KIND_PRIVATE
    return range(start, start + (count << 2), 4)


def prompt_tokens(
    block_keys: Sequence[int],
    block_token_counts: Sequence[int],
    block_size: int,
    ordinal: int,
    private_tail: int = 0,
) -> tuple[int, ...]:
    """Concatenate the token ids of the hashed blocks, then ``private_tail`` private ids.

    ``block_token_counts[i]`` is the token count of block ``i`` (``block_size``
    for a full block).  Returns a new tuple; the inputs are not modified.
    """
    parts: list[range] = []
    for key, count in zip(block_keys, block_token_counts, strict=True):
        if count == block_size:
            parts.append(full_block_tokens(key, block_size))
        else:
            parts.append(partial_block_tokens(key, block_size, count))
    if private_tail:
        parts.append(private_tokens(ordinal, private_tail))
    return tuple(chain.from_iterable(parts))
