"""``KVCacheBlocks``: the blocks a ``KVCacheManager`` call returns, one tuple per KV-cache group.

Immutable: built by the managers from block views (``KVCacheBlock``), read by
the scheduler (``get_block_ids``) and handed back as hits to
``allocate_slots``.
"""

from __future__ import annotations

import attrs

from kvstate.vllm.block_pool import KVCacheBlock


@attrs.frozen
class KVCacheBlocks:
    """Blocks per KV-cache group: ``blocks[group][j]``."""

    blocks: tuple[tuple[KVCacheBlock, ...], ...]

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([block.block_id for block in group] for group in self.blocks)

    def get_unhashed_block_ids(self) -> list[int]:
        """Group 0's blocks that are not cached (vLLM allows this for one group only)."""
        return [block.block_id for block in self.blocks[0] if block.block_hash is None]

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(a + b for a, b in zip(self.blocks, other.blocks, strict=True)))


def checked_blocks(value: object) -> KVCacheBlocks:
    """``value`` if it is a ``KVCacheBlocks`` (hits handed back to ``allocate_slots``), else a
    ``TypeError`` before anything is read or changed."""
    if not isinstance(value, KVCacheBlocks):
        raise TypeError("new_computed_blocks must be the KVCacheBlocks that get_computed_blocks "
                        f"returned, got {type(value).__name__}")
    return value


EMPTY_BLOCKS = KVCacheBlocks(((),))  # the one-group manager's empty result (vLLM's is per manager)
