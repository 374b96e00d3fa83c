"""Shared helpers for tests that drive the vLLM front end (``kvstate.vllm``) as its scheduler would."""

from __future__ import annotations

from kvstate.vllm.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from kvstate.vllm.manager import KVCacheBlocks, KVCacheManager
from kvstate.vllm.request import Request

# The hybrid tests' layer specs: block size 4, a window of 8 tokens, Mamba in align mode.
BS = 4
FULL = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float32")
SWA = SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float32",
                        sliding_window=8)
MAMBA = MambaSpec(block_size=BS, shapes=((2, 8),), dtypes=("float32",), mamba_cache_mode="align")


def hybrid_config(*specs: object, num_blocks: int, retention: int | None = 0) -> KVCacheConfig:
    """A ``KVCacheConfig`` with one KV-cache group per spec, in order."""
    groups = [KVCacheGroupSpec([f"l{i}"], spec) for i, spec in enumerate(specs)]  # type: ignore[arg-type]
    return KVCacheConfig(num_blocks, [], groups, prefix_cache_retention_interval=retention)


def admit(manager: KVCacheManager, request: Request) -> tuple[list[int], int, KVCacheBlocks | None]:
    """Scheduler admission of a waiting request: look up, then allocate every token not hit.

    When the allocation succeeds the lookup is counted (prefix-cache
    statistics, as vLLM's scheduler does at admission) and the whole prompt
    counts as computed (the scheduler's update after the step), so a following
    ``allocate_slots(request, n)`` is a decode step.  Returns the hit block
    ids, the hit tokens and the newly allocated blocks (None: not enough room,
    and nothing was allocated).
    """
    blocks, hit, boundary = manager.get_computed_blocks(request)
    assert boundary == 0  # one KV cache group: no shared-prefix boundary
    new = manager.allocate_slots(request, request.num_tokens - hit, hit, blocks)
    if new is not None:
        manager.record_prefix_cache_stats(request, hit)
        request.num_computed_tokens = request.num_tokens
    return blocks.get_block_ids()[0], hit, new


def ids(blocks: KVCacheBlocks | None) -> list[int] | None:
    """The block ids of ``blocks`` (group 0), or None when there are none (a refused allocation)."""
    return None if blocks is None else blocks.get_block_ids()[0]
