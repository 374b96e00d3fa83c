"""Sliding-window rules of vLLM 0.33's ``SlidingWindowManager`` (pure functions).

Owned by the vLLM front end.  A sliding-window layer attends only to the last
``window`` tokens, so blocks wholly before ``num_computed - window + 1`` are
"skipped": the manager replaces them with the null block and frees them, and a
prefix hit needs only a run of ``cdiv(window - 1, block_size)`` contiguous
cached blocks ending at the hit, found by scanning right to left.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def num_skipped_tokens(window: int, num_computed_tokens: int) -> int:
    """Tokens before the window of the next token: ``max(0, n - window + 1)``."""
    return max(0, num_computed_tokens - window + 1)


def contiguous_blocks_for_hit(window: int, block_size: int) -> int:
    """Cached blocks a hit must end with: ``cdiv(window - 1, block_size)``."""
    return -(-(window - 1) // block_size)


def longest_window_hit(cached: Sequence[T | None], window: int, block_size: int,
                       null: T) -> list[T]:
    """The hit for one sliding-window group, given each full block's first cached copy.

    ``cached[i]`` is block ``i``'s cached copy or None (only the first
    ``max_length // block_size`` blocks are passed).  Scanning right to left,
    the first run of ``contiguous_blocks_for_hit`` cached blocks ends the hit
    (earlier positions become ``null``); with no such run, the leading run of
    cached blocks from block 0 is the hit.  Pure.
    """
    need = contiguous_blocks_for_hit(window, block_size)
    run = 0
    for index in range(len(cached) - 1, -1, -1):
        if cached[index] is not None:
            run += 1
            if run >= need:
                hit: list[T] = [null] * index
                hit.extend(c for c in cached[index:index + run])  # type: ignore[misc]
                return hit
        else:
            run = 0
    return [c for c in cached[:run]]  # type: ignore[misc]


def skipped_block_indices(table: Sequence[int], window: int, block_size: int,
                          num_computed_tokens: int, is_null: Callable[[int], bool]) -> list[int]:
    """Table indices ``remove_skipped_blocks`` frees, highest first, stopping at a null."""
    skipped = num_skipped_tokens(window, num_computed_tokens) // block_size
    skipped = min(skipped, len(table))
    out: list[int] = []
    for index in range(skipped - 1, -1, -1):
        if is_null(table[index]):
            break
        out.append(index)
    return out
