"""Scheduler-side decisions a driver of the vLLM front end needs to follow vLLM's steps.

vLLM's scheduler, not its KV-cache manager, decides how a Mamba "align"
model's prefill is chunked: a state is only cached where a chunk ends, so
chunks must end on block boundaries and at the positions a later request can
resume at.  :func:`mamba_aligned_chunk` reproduces that split (vLLM 0.33's
``Scheduler._mamba_block_aligned_split`` for the default configuration: no
EAGLE, no sub-block hash hits, no prefill-checkpoint blocks, no lookahead
hashing).  Pure: it reads the request and returns a count.
"""

from __future__ import annotations

from kvstate.vllm.request import Request


def mamba_aligned_chunk(request: Request, num_new_tokens: int,
                        num_new_local_computed_tokens: int = 0, *, block_size: int,
                        max_prefill_tokens: int | None = None) -> int:
    """How many of ``num_new_tokens`` the scheduler schedules in this step.

    Past the prefill (the prompt, or every token but the last for a resumed
    request) nothing is split.  A chunk that does not finish the prefill ends
    on a block boundary (unless that leaves it empty and one block is more
    than ``max_prefill_tokens``, vLLM's chunk limit; None: no limit); then it
    stops at the first of: the next block boundary when it starts mid-block,
    the prompt's last aligned position (``(num_tokens - 1)`` floored to a
    block), the block-floored ``request.shared_prefix_boundary``.
    """
    start = request.num_computed_tokens + num_new_local_computed_tokens
    prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
    if start >= prefill_end:
        return num_new_tokens
    last_cache = max(0, (request.num_tokens - 1) // block_size * block_size)
    end = start + num_new_tokens
    if end < prefill_end:
        aligned = end // block_size * block_size
        if aligned > start or max_prefill_tokens is None or block_size <= max_prefill_tokens:
            end = aligned
    junction = request.shared_prefix_boundary
    stops = ((start // block_size + 1) * block_size if start % block_size else 0, last_cache,
             start + (junction - start) // block_size * block_size
             if start < junction < end else 0)
    end = min((stop for stop in stops if start < stop < end), default=end)
    return max(end - start, 0)
