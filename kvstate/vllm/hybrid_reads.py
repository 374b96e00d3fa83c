"""``HybridReads``: the reading half of vLLM 0.33's hybrid ``KVCacheManager`` (commits nothing).

The base of ``kvstate.vllm.hybrid.HybridKVCacheManager``, which owns the
state these methods read (the per-request cursors and core-request names,
the Mamba states cached this step) and every call that changes it.  Here:
the tables as block views or ids per group, the longest prefix hit
(``kvstate.planner.hybrid_hits.longest_hit``), the free-block predictor
(``kvstate.planner.hybrid_step.blocks_needed``), the scheduler's Mamba
chunk split, and the argument checks the calls share.
"""

from __future__ import annotations

from typing import Any

from kvstate.config import non_negative_int
from kvstate.planner.hybrid_hits import GroupCursor, HybridLayout, group_holders, longest_hit
from kvstate.planner.hybrid_step import blocks_needed
from kvstate.vllm.block_pool import KVCacheBlock
from kvstate.vllm.blocks import KVCacheBlocks, checked_blocks
from kvstate.vllm.manager import KVCacheManager
from kvstate.vllm.request import Request
from kvstate.vllm.scheduling import mamba_aligned_chunk


class HybridReads(KVCacheManager):
    """What a hybrid manager answers without changing anything (see the module docstring)."""

    layout: HybridLayout
    num_kv_cache_groups: int
    has_mamba: bool
    cursors: dict[str, tuple[GroupCursor, ...]]
    holders: dict[str, tuple[str, ...]]
    fresh_states: set[tuple[int, bytes]]
    _new_cursors: tuple[GroupCursor, ...]
    _max_id_chars: int
    _lookup: tuple[Request, KVCacheBlocks, tuple[tuple[int, ...], ...], int] | None

    def _group_tables(self, request_id: str) -> tuple[tuple[int, ...], ...]:
        requests = self.engine.view.requests
        tables = []
        for holder in self._holders(request_id):
            record = requests.get(holder)
            tables.append(() if record is None else tuple(record.pages))
        return tuple(tables)

    def _blocks(self, pages: tuple[tuple[int, ...], ...]) -> KVCacheBlocks:
        if not any(pages):
            return self.empty_kv_cache_blocks
        views = self.block_pool.blocks.__getitem__
        return KVCacheBlocks(tuple([tuple(map(views, group)) for group in pages]))

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's tables as block views, per group (nulls included).  Commits nothing."""
        return self._blocks(self._group_tables(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's tables as ids, per group (0: null block).  Commits nothing."""
        return tuple(list(table) for table in self._group_tables(request_id))

    def get_computed_blocks(self, request: Request, max_cache_hit_length: int | None = None,
                            ) -> tuple[KVCacheBlocks, int, int]:
        """``(hit blocks per group, hit tokens, shared-prefix boundary)``; commits nothing.

        The hit is the longest prefix every group can resume at (at most
        ``num_tokens - 1``), vLLM's fixed point; the boundary is where the
        longest single group's hit ends when a sparse group lags it (0 if
        none): the scheduler stores it as ``request.shared_prefix_boundary``.
        """
        self._check_request(request)
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        limit = request.num_tokens - 1  # the last token is always computed
        if max_cache_hit_length is not None:
            limit = min(limit, non_negative_int("max_cache_hit_length", max_cache_hit_length))
        view = self.engine.view
        pages, hit, uncached = longest_hit(view, self.layout, request, limit)
        blocks = self._blocks(pages)
        if blocks is not self.empty_kv_cache_blocks:
            self._lookup = (request, blocks, pages, view.seq)
        return blocks, hit, hit + uncached if uncached else 0

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int,
                                   new_computed_blocks: Any, total_computed_tokens: int) -> int:
        """vLLM's coordinator predictor summed over groups (``new_computed_blocks``: a
        ``KVCacheBlocks``, one list per group).  Commits nothing."""
        if not isinstance(new_computed_blocks, KVCacheBlocks):
            raise TypeError("a hybrid manager takes the hits as KVCacheBlocks (one per group)")
        hits = self._hit_ids(new_computed_blocks)
        count = max(len(group) for group in hits)
        # Only the last hit's hash is read (a Mamba state cached this step is refused); every
        # group's block at that position has the same vLLM hash.
        last = next((self.block_pool.blocks[group[-1]].block_hash for group in hits
                     if group and group[-1]), None)
        hashes = [b""] * (count - 1) + [last[:-4] if last else b""] if count else []
        return blocks_needed(self.engine.view, self.layout, self._holders(request_id), hashes,
                             self._cursors(request_id), hits, num_tokens=num_tokens,
                             main_tokens=num_tokens, total_computed=total_computed_tokens,
                             admission=False, fresh=self.fresh_states)

    # -- the scheduler's Mamba chunk split --------------------------------------------------
    def mamba_block_aligned_split(self, request: Request, num_new_tokens: int,
                                  num_new_local_computed_tokens: int = 0, *,
                                  max_prefill_tokens: int | None = None) -> int:
        """How many of ``num_new_tokens`` vLLM's scheduler schedules in this prefill chunk
        (``kvstate.vllm.scheduling.mamba_aligned_chunk``; unchanged without a Mamba group).
        Commits nothing."""
        if not self.has_mamba:
            return num_new_tokens
        return mamba_aligned_chunk(request, num_new_tokens, num_new_local_computed_tokens,
                                   block_size=self.block_size,
                                   max_prefill_tokens=max_prefill_tokens)

    def _hit_ids(self, blocks: KVCacheBlocks) -> tuple[tuple[int, ...], ...]:
        checked_blocks(blocks)
        if len(blocks.blocks) != self.num_kv_cache_groups:
            raise ValueError(f"hits for {len(blocks.blocks)} groups, the manager has "
                             f"{self.num_kv_cache_groups}")
        groups: list[tuple[int, ...]] = []
        for group in blocks.blocks:
            views: list[KVCacheBlock] = list(group)
            groups.append(tuple(self.block_pool.ids_of(views, keep_null=True)))
        return tuple(groups)

    # -- helpers --------------------------------------------------------------------------------
    def _check_request(self, request: Request) -> None:
        if request.block_size != self.block_size or request.hash_seed != self.hash_seed or \
                request.hash_algo != self.hash_algo:
            super()._check_request(request)
        request_id = request.request_id
        if request_id not in self.holders and len(request_id) > self._max_id_chars:
            # each group's table is a core request named "<id>/g<g>"
            raise ValueError(f"request ids of a {self.num_kv_cache_groups}-group manager are at "
                             f"most {self._max_id_chars} characters")

    def _holders(self, request_id: str) -> tuple[str, ...]:
        found = self.holders.get(request_id)
        return found if found is not None else group_holders(request_id,
                                                             self.num_kv_cache_groups)

    def _cursors(self, request_id: str) -> tuple[GroupCursor, ...]:
        return self.cursors.get(request_id) or self._new_cursors
