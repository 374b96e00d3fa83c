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
``kvstate.planner.hybrid_hits`` and ``hybrid_step``) inside one engine
batch per call that changes anything (``kvstate.vllm.call_batch``: a call
that decides nothing opens none).  This class owns vLLM's calls that
change state, the per-request ``GroupCursor`` tuples (vLLM's per-group
counters), the Mamba states cached in the current step (``fresh_states``,
cleared by ``new_step_starts``) and the statistics; the reading calls, the
Mamba chunk split and the shared argument checks are in its base
``kvstate.vllm.hybrid_reads.HybridReads``; the shortcut for decode steps
that change nothing is ``kvstate.vllm.hybrid_idle.IdleSteps``.
"""

from __future__ import annotations

from typing import Any

from kvstate.config import non_negative_int
from kvstate.events import MAX_NAME_CHARS
from kvstate.planner.alloc import cdiv
from kvstate.planner.hybrid_hits import CACHED, MAMBA, GroupCursor, group_holders
from kvstate.planner.hybrid_step import step_is_idle
from kvstate.planner.hybrid_vllm import (
    plan_hybrid_allocate,
    plan_hybrid_cache,
    plan_hybrid_free,
    plan_hybrid_remove_skipped,
)
from kvstate.vllm.block_pool import BlockPool
from kvstate.vllm.blocks import KVCacheBlocks
from kvstate.vllm.call_batch import CallBatch
from kvstate.vllm.hybrid_idle import IdleSteps
from kvstate.vllm.hybrid_reads import HybridReads
from kvstate.vllm.kv_cache_interface import group_layout, spec_kind, spec_sliding_window
from kvstate.vllm.kv_events import KVCacheEvent
from kvstate.vllm.manager_args import check_allocation, vllm_manager_args
from kvstate.vllm.request import Request, request_id_of
from kvstate.vllm.stats import PrefixCacheStats


class HybridKVCacheManager(HybridReads):
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
        self._new_cursors = (GroupCursor(),) * len(groups)
        # request ids leave room for the "/g<group>" suffix of the groups' core requests
        self._max_id_chars = MAX_NAME_CHARS - len(f"/g{len(groups) - 1}")
        # The last get_computed_blocks: (request, its hit blocks, their ids, engine seq), so
        # allocate_slots knows hits it found itself in the same state (see check_hits).
        self._lookup: tuple[Request, KVCacheBlocks, tuple[tuple[int, ...], ...], int] | None = \
            None
        self.idle_steps = IdleSteps(self.layout, self.max_model_len, self._covered)
        self.engine.subscribe(self.idle_steps)  # bounds end when a held block leaves the cache

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
        idle = None  # None: no idle bounds known for the request; False: the step is past them
        if not full_sequence_must_fit and new_computed_blocks is None:
            idle = self.idle_steps.take(request, num_new_tokens, num_new_computed_tokens,
                                        num_lookahead_tokens)
            if idle:
                return self.empty_kv_cache_blocks  # inside the request's idle bounds
        request_id = request.request_id
        self.idle_steps.drop(request_id)
        self._check_request(request)
        hits = None
        found_here = False
        if new_computed_blocks is not None and new_computed_blocks is not \
                self.empty_kv_cache_blocks:
            lookup = self._lookup
            if lookup is not None and lookup[1] is new_computed_blocks and \
                    lookup[0] is request and lookup[3] == self.engine.view.seq:
                hits, found_here = lookup[2], True  # found by this manager, nothing changed since
            else:
                hits = self._hit_ids(new_computed_blocks)
        cursors = self.cursors.get(request_id) or self._new_cursors
        num_hits = 0
        if hits is not None:
            num_hits = len(hits[0])
            if any([len(group) != num_hits for group in hits]):
                raise ValueError("hit lists of different lengths per group: "
                                 f"{sorted({len(group) for group in hits})}")
        num_local = check_allocation(
            request, num_new_tokens, num_new_computed_tokens, num_lookahead_tokens, num_hits,
            self.block_size, self.max_model_len, self._covered.get(request_id, 0),
            running_with_hits=num_hits > 0 and any(map(CACHED, cursors)))
        main_tokens = num_local + num_new_tokens
        need_slots = main_tokens + num_lookahead_tokens
        if need_slots > self.max_model_len:
            need_slots = self.max_model_len
        num_tokens = request.num_tokens
        cache_upto = main_tokens if main_tokens < num_tokens else num_tokens
        remove_upto = num_local - request.num_in_flight_tokens
        if remove_upto < 0:
            remove_upto = 0
        holders = self.holders.get(request_id) or group_holders(request_id,
                                                                self.num_kv_cache_groups)
        if hits is None and not full_sequence_must_fit and idle is None and step_is_idle(
                self.engine.view, self.layout, holders, request, cursors, need_slots,
                main_tokens, cache_upto, remove_upto):
            self._covered[request_id] = cache_upto  # a decode step inside a block: no change
            self.idle_steps.remember(self.engine.view, holders, request, cursors, cache_upto,
                                 remove_upto)
            return self.empty_kv_cache_blocks
        full = min(num_tokens, self.max_model_len) if full_sequence_must_fit else None
        with CallBatch(self.engine, self.block_pool.hashes, request) as b:
            new_pages, cursors, fresh = plan_hybrid_allocate(
                b, self.layout, holders, request, cursors, hits, num_local=num_local,
                need_slots=need_slots, main_tokens=main_tokens, cache_upto=cache_upto,
                remove_upto=remove_upto, full_tokens=full, fresh=self.fresh_states,
                hits_found_here=found_here)
            # Book-keeping inside the batch: a listener failing at its commit raises after
            # the events are applied, and the cursors must follow them.
            self._track(request_id, holders, cursors)
            if fresh:
                self.fresh_states.update(fresh)
            if new_pages is not None:
                self._covered[request_id] = cache_upto
                self.idle_steps.remember(self.engine.view, holders, request, cursors,
                                         cache_upto, remove_upto)
        if new_pages is None:
            return None
        return self._blocks(new_pages)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache every group's newly full blocks up to ``num_tokens`` (vLLM ``cache_blocks``).

        Commits one ``BlockCache`` per group with new full blocks (nothing with
        caching off).
        """
        if not self.enable_caching:
            return
        self._check_request(request)  # its hashes must be the ones the tree is keyed by
        request_id = request.request_id
        self.idle_steps.drop(request_id)
        holders = self._holders(request_id)
        with CallBatch(self.engine, self.block_pool.hashes, request) as b:
            cursors, fresh = plan_hybrid_cache(b, self.layout, holders, request,
                                               self._cursors(request_id), num_tokens)
            self._track(request_id, holders, cursors)  # inside: see ``allocate_slots``
            self.fresh_states.update(fresh)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Free what each group no longer reads at ``num_computed_tokens`` (sliding windows:
        blocks before the window; Mamba: states before the last).  Commits ``BlockRelease``."""
        non_negative_int("num_computed_tokens", num_computed_tokens)
        if request_id not in self.holders:
            return  # a request it never allocated holds nothing to free (vLLM: a no-op)
        self.idle_steps.drop(request_id)
        holders = self._holders(request_id)
        with CallBatch(self.engine) as b:
            cursors = plan_hybrid_remove_skipped(b, self.layout, holders,
                                                 self._cursors(request_id), num_computed_tokens)
            self._track(request_id, holders, cursors)  # inside: see ``allocate_slots``

    def free(self, request: Request | str) -> None:
        """Free the request group by group, each table last block first, and forget it.

        Commits one ``BlockRelease`` (closing the group's table) per group that has one.
        """
        request_id = request_id_of(request)
        self.idle_steps.drop(request_id)
        with CallBatch(self.engine) as b:
            plan_hybrid_free(b, self._holders(request_id), caching=self.enable_caching)
            self.cursors.pop(request_id, None)  # inside: see ``allocate_slots``
            self.holders.pop(request_id, None)
            self._covered.pop(request_id, None)

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the pool's events; each ``BlockStored`` gains its group's spec kind and window
        (vLLM fills them here, not in the pool).  Commits nothing."""
        if not self.enable_kv_cache_events:
            return []
        return self.block_pool.hashes.take_events(self.kv_cache_event_metadata)

    # -- helpers --------------------------------------------------------------------------------
    def _track(self, request_id: str, holders: tuple[str, ...],
               cursors: tuple[GroupCursor, ...]) -> None:
        """Remember the request's cursors (and its groups' core requests while it is known)."""
        self.cursors[request_id] = cursors
        if request_id not in self.holders:
            self.holders[request_id] = holders
