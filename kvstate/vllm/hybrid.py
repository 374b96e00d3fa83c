"""``HybridKVCacheManager``: vLLM 0.33's KV-cache manager for hybrid models, on the block core.

``KVCacheManager(kv_cache_config, ...)`` builds this class when the config
has several KV-cache groups (full attention next to sliding-window and / or
Mamba "align" groups), a Mamba group, or a sliding window with sparse
retention.  One ``BlockPool`` (one free queue) serves every group, as in
vLLM's ``HybridKVCacheCoordinator``.  On the core:

* group ``g`` of request ``r`` is the core request ``"r/g{g}"``; its table
  is that request's table (page 0 = null block);
* group ``g``'s blocks are cached along their own prefix-tree path (the
  group id leads each block's extra keys, ``Request.group_chain``), so a
  block's hash carries its group and the KV events their ``group_idx``.

Every decision is made by ``kvstate.planner.hybrid_vllm`` (reads in
``kvstate.planner.hybrid_hits``) inside one engine batch per call.  The
manager owns vLLM's API, the per-request ``GroupCursor`` tuples (vLLM's
per-group counters), the Mamba states cached in the current step
(``fresh_states``, cleared by ``new_step_starts``) and the statistics.
:meth:`HybridKVCacheManager.mamba_block_aligned_split` reproduces the
scheduler's Mamba chunk split so a driver follows vLLM's prefill chunks.
"""

from __future__ import annotations

from typing import Any

from kvstate.events import MAX_NAME_CHARS
from kvstate.planner.alloc import cdiv
from kvstate.planner.hybrid_hits import (
    MAMBA,
    GroupCursor,
    blocks_needed,
    group_holders,
    longest_hit,
)
from kvstate.planner.hybrid_vllm import (
    plan_hybrid_allocate,
    plan_hybrid_cache,
    plan_hybrid_free,
    plan_hybrid_remove_skipped,
)
from kvstate.vllm.block_pool import BlockPool, KVCacheBlock
from kvstate.vllm.blocks import KVCacheBlocks
from kvstate.vllm.kv_cache_interface import group_layout, spec_kind, spec_sliding_window
from kvstate.vllm.kv_event_types import with_spec
from kvstate.vllm.kv_events import BlockStored, KVCacheEvent
from kvstate.vllm.manager import KVCacheManager
from kvstate.vllm.manager_args import check_allocation, vllm_manager_args
from kvstate.vllm.request import Request
from kvstate.vllm.scheduling import mamba_aligned_chunk
from kvstate.vllm.stats import PrefixCacheStats


class HybridKVCacheManager(KVCacheManager):
    """vLLM 0.33's ``KVCacheManager`` over several KV-cache groups, deciding exactly as 0.33.

    Built through ``KVCacheManager(kv_cache_config, max_model_len,
    scheduler_block_size, hash_block_size, ...)`` (vLLM's signature; see
    ``manager_args.vllm_manager_args``).  ``get_block_ids`` and the blocks it
    returns are per group, in the config's group order.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        options = vllm_manager_args(*args, **kwargs)
        config = options.config
        self.kv_cache_config = config
        self.layout = group_layout(
            config, scheduler_block_size=options.scheduler_block_size,
            hash_block_size=options.hash_block_size, max_model_len=options.max_model_len,
            max_in_flight_tokens=options.max_in_flight_tokens,
            enable_caching=options.enable_caching)
        groups = config.kv_cache_groups
        self.num_kv_cache_groups = len(groups)
        self.block_size = options.hash_block_size
        self.max_model_len = options.max_model_len
        self.enable_caching = options.enable_caching
        self.sliding_window = None  # per group: see kv_cache_event_metadata
        self.admission_cap = None  # per group: see layout.rules
        self.enable_kv_cache_events = options.enable_kv_cache_events
        self.hash_algo = options.hash_algo
        self.hash_seed = options.hash_seed
        self.log_stats = options.log_stats
        self.block_pool = BlockPool(
            config.num_blocks, options.enable_caching, self.block_size,
            options.enable_kv_cache_events, hash_seed=options.hash_seed,
            hash_algo=options.hash_algo,
            max_blocks_per_request=cdiv(options.max_model_len, self.block_size) + 1,
            keep_events=options.keep_events, engine=options.engine,
            num_kv_cache_groups=len(groups))
        self.engine = self.block_pool.engine
        self.running = {}  # unused here: the per-group counters are in ``cursors``
        self.cursors: dict[str, tuple[GroupCursor, ...]] = {}
        self.holders: dict[str, tuple[str, ...]] = {}  # the groups' core requests, per request
        self._covered: dict[str, int] = {}
        self.fresh_states: set[tuple[int, bytes]] = set()  # Mamba states cached this step
        self.prefix_cache_stats = PrefixCacheStats() if options.log_stats else None
        self.empty_kv_cache_blocks = KVCacheBlocks(((),) * len(groups))
        self.kv_cache_event_metadata = tuple(
            (spec_kind(group.kv_cache_spec), spec_sliding_window(group.kv_cache_spec))
            for group in groups)
        self.has_mamba = any(rule.kind == MAMBA for rule in self.layout.rules)

    # -- reading ------------------------------------------------------------------------------
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
        blocks = self.block_pool.blocks
        return KVCacheBlocks(tuple(tuple(blocks[page] for page in group) for group in pages))

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
        limit = request.num_tokens - 1 if max_cache_hit_length is None else max_cache_hit_length
        pages, hit, uncached = longest_hit(self.engine.view, self.layout, request, limit)
        return self._blocks(pages), hit, hit + uncached if uncached else 0

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

    # -- changing (one engine batch per call) -------------------------------------------------
    def new_step_starts(self) -> None:
        """A new scheduler step: Mamba may again resume from states cached before it.
        Commits nothing."""
        self.fresh_states.clear()

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks: KVCacheBlocks | None = None,
                       num_lookahead_tokens: int = 0, *,
                       full_sequence_must_fit: bool = False) -> KVCacheBlocks | None:
        """Give the request's groups slots for its new tokens; None when the pool is short.

        Commits, in vLLM 0.33's order: nothing at all when
        ``full_sequence_must_fit`` and the whole sequence would not fit
        (sliding windows counted at most their admission cap; a Mamba hit on a
        state cached in this step never fits); then ``BlockRelease`` of what
        each group no longer reads (kept even when the call returns None); if
        the pool has room, ``ReqAlloc`` + ``BlockHold`` of every group's hits
        (nulls before them), each group's new blocks (``BlockHold`` of Mamba's
        null padding, ``BlockUncache`` + ``BlockAlloc``), and one
        ``BlockCache`` per group with newly full blocks.  Returns the new
        blocks per group (Mamba's include its null padding).  Bad arguments
        raise ``ValueError`` / ``TypeError`` with nothing changed.
        """
        self._check_request(request)
        request_id = request.request_id
        hits = None
        if new_computed_blocks is not None and new_computed_blocks is not \
                self.empty_kv_cache_blocks:
            hits = self._hit_ids(new_computed_blocks)
        cursors = self._cursors(request_id)
        lengths = {len(group) for group in hits} if hits is not None else {0}
        if len(lengths) != 1:
            raise ValueError(f"hit lists of different lengths per group: {sorted(lengths)}")
        num_hits = lengths.pop()
        running = any(cursor.cached is not None for cursor in cursors)
        num_local = check_allocation(request, num_new_tokens, num_new_computed_tokens,
                                     num_lookahead_tokens, num_hits, self.block_size,
                                     self.max_model_len, self._covered.get(request_id, 0),
                                     running_with_hits=running and num_hits > 0)
        main_tokens = num_local + num_new_tokens
        full = min(request.num_tokens, self.max_model_len) if full_sequence_must_fit else None
        with self.block_pool.offer_hashes(request), self.engine.batch() as b:
            done = plan_hybrid_allocate(
                b, self.layout, self._holders(request_id), request, cursors, hits,
                num_local=num_local,
                total=num_local, need_slots=min(main_tokens + num_lookahead_tokens,
                                                self.max_model_len),
                main_tokens=main_tokens, cache_upto=min(main_tokens, request.num_tokens),
                remove_upto=max(0, num_local - request.num_in_flight_tokens),
                full_tokens=full, fresh=self.fresh_states)
        self.cursors[request_id] = done.cursors
        self.fresh_states |= done.fresh
        if done.new_pages is None:
            return None
        self._covered[request_id] = min(main_tokens, request.num_tokens)
        return self._blocks(done.new_pages)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache every group's newly full blocks up to ``num_tokens`` (vLLM ``cache_blocks``).

        Commits one ``BlockCache`` per group with new full blocks (nothing with
        caching off).
        """
        if not self.enable_caching:
            return
        request_id = request.request_id
        with self.block_pool.offer_hashes(request), self.engine.batch() as b:
            cursors, fresh = plan_hybrid_cache(b, self.layout, self._holders(request_id),
                                               request, self._cursors(request_id), num_tokens)
        self.cursors[request_id] = cursors
        self.fresh_states |= fresh

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Free what each group no longer reads at ``num_computed_tokens`` (sliding windows:
        blocks before the window; Mamba: states before the last).  Commits ``BlockRelease``."""
        with self.engine.batch() as b:
            cursors = plan_hybrid_remove_skipped(b, self.layout, self._holders(request_id),
                                                 self._cursors(request_id), num_computed_tokens)
        self.cursors[request_id] = cursors

    def free(self, request: Request | str) -> None:
        """Free the request group by group, each table last block first, and forget it.

        Commits one ``BlockRelease`` (closing the group's table) per group that has one.
        """
        request_id = request if isinstance(request, str) else request.request_id
        with self.engine.batch() as b:
            plan_hybrid_free(b, self._holders(request_id), caching=self.enable_caching)
        self.cursors.pop(request_id, None)
        self.holders.pop(request_id, None)
        self._covered.pop(request_id, None)

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the pool's events; each ``BlockStored`` gains its group's spec kind and window
        (vLLM fills them here, not in the pool).  Commits nothing."""
        out: list[KVCacheEvent] = []
        metadata = self.kv_cache_event_metadata
        for event in self.block_pool.take_events():
            if isinstance(event, BlockStored) and event.group_idx is not None \
                    and 0 <= event.group_idx < len(metadata):
                event = with_spec(event, *metadata[event.group_idx])
            out.append(event)
        return out

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

    # -- helpers --------------------------------------------------------------------------------
    def _check_request(self, request: Request) -> None:
        super()._check_request(request)
        longest = len(group_holders(request.request_id, self.num_kv_cache_groups)[-1])
        if longest > MAX_NAME_CHARS:  # each group's table is a core request named "<id>/g<g>"
            raise ValueError(f"request ids of a {self.num_kv_cache_groups}-group manager are at "
                             f"most {MAX_NAME_CHARS - longest + len(request.request_id)} "
                             "characters")

    def _holders(self, request_id: str) -> tuple[str, ...]:
        found = self.holders.get(request_id)
        if found is None:
            found = group_holders(request_id, self.num_kv_cache_groups)
            if request_id in self.cursors:  # remembered while the request is known
                self.holders[request_id] = found
        return found

    def _cursors(self, request_id: str) -> tuple[GroupCursor, ...]:
        found = self.cursors.get(request_id)
        return found if found is not None else (GroupCursor(),) * self.num_kv_cache_groups

    def _hit_ids(self, blocks: KVCacheBlocks) -> tuple[tuple[int, ...], ...]:
        if len(blocks.blocks) != self.num_kv_cache_groups:
            raise ValueError(f"hits for {len(blocks.blocks)} groups, the manager has "
                             f"{self.num_kv_cache_groups}")
        groups: list[tuple[int, ...]] = []
        for group in blocks.blocks:
            views: list[KVCacheBlock] = list(group)
            groups.append(tuple(self.block_pool.ids_of(views, keep_null=True)))
        return tuple(groups)
