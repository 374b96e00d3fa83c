"""``KVCacheManager``: vLLM 0.33's KV-cache manager (one group) on the block-mode core.

Covers vLLM's ``KVCacheManager`` with a unitary coordinator over one
full-attention or sliding-window group.  Each request's block table is its
core request table (page 0 = null block), its references are core holders,
and the prefix cache is the core's block-mode prefix tree.  Every decision
(which blocks, in which order, whether a request is admitted) is made by
``kvstate.planner.block`` inside one engine batch per call, so a call's
events commit together and a rejected call commits none.

It is built either as kvstate's simple ``KVCacheManager(num_blocks,
block_size, max_model_len, ...)`` or with vLLM 0.33's signature
``KVCacheManager(kv_cache_config, max_model_len, scheduler_block_size,
hash_block_size, ...)``; a configuration with several groups (or one that
needs them, see ``manager_args.needs_groups``) builds the grouped
``kvstate.vllm.hybrid.HybridKVCacheManager`` instead.

The manager owns vLLM's API surface and the scheduler-side bookkeeping:
``running`` (vLLM's ``num_cached_block`` per running request, with a tree
memo), what each request's last allocation covered (to catch a scheduler
that did not advance ``num_computed_tokens``), and the prefix-cache
statistics.  The scheduler loop it expects is documented in docs/vllm.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

from kvstate.config import non_negative_int
from kvstate.engine import Engine
from kvstate.planner.alloc import cdiv
from kvstate.planner.block import (
    allocation_is_idle,
    plan_allocate_slots,
    plan_cache_blocks,
    plan_free_request,
    plan_remove_skipped,
)
from kvstate.planner.block_hits import Running, blocks_to_allocate, cached_prefix
from kvstate.vllm.block_pool import BlockPool, KVCacheBlock
from kvstate.vllm.blocks import EMPTY_BLOCKS, KVCacheBlocks, checked_blocks
from kvstate.vllm.call_batch import CallBatch
from kvstate.vllm.hashing import HashAlgo
from kvstate.vllm.kv_cache_interface import KVCacheConfig
from kvstate.vllm.kv_event_types import with_spec
from kvstate.vllm.kv_events import BlockStored, KVCacheEvent
from kvstate.vllm.manager_args import (
    check_allocation,
    config_argument,
    needs_groups,
    one_group_arguments,
    vllm_manager_args,
)
from kvstate.vllm.request import Request, request_id_of
from kvstate.vllm.stats import PrefixCacheStats


class KVCacheManager:
    """vLLM's ``KVCacheManager`` for one KV-cache group, deciding exactly as 0.33 does."""

    def __new__(cls, *args: Any, **kwargs: Any) -> KVCacheManager:
        config = config_argument(args, kwargs)
        if cls is KVCacheManager and config is not None and needs_groups(config):
            # Imported here: the grouped manager subclasses this one.
            from kvstate.vllm.hybrid import HybridKVCacheManager
            return super().__new__(HybridKVCacheManager)
        return super().__new__(cls)

    @overload
    def __init__(self, num_blocks: int, block_size: int, max_model_len: int,
                 enable_caching: bool = ..., sliding_window: int | None = ...,
                 enable_kv_cache_events: bool = ..., hash_algo: HashAlgo = ...,
                 hash_seed: str | int | None = ..., *, log_stats: bool = ...,
                 keep_events: bool = ..., engine: Engine | None = ...) -> None: ...
    @overload
    def __init__(self, kv_cache_config: KVCacheConfig, max_model_len: int,
                 scheduler_block_size: int, hash_block_size: int,
                 max_in_flight_tokens: int | None = ..., enable_caching: bool = ...,
                 use_eagle: bool = ..., num_hash_lookahead_tokens: int = ...,
                 num_prefill_lookahead: int = ..., log_stats: bool = ...,
                 enable_kv_cache_events: bool = ..., dcp_world_size: int = ...,
                 pcp_world_size: int = ..., metrics_collector: Any = ..., watermark: float = ...,
                 enable_mamba_shared_prefix_checkpoint: bool = ..., *,
                 hash_algo: HashAlgo = ..., hash_seed: str | int | None = ...,
                 keep_events: bool = ..., engine: Engine | None = ...) -> None: ...
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if config_argument(args, kwargs) is None:
            self._setup(*args, **kwargs)
            return
        self._setup(**one_group_arguments(vllm_manager_args(*args, **kwargs)))

    def _setup(self, num_blocks: int, block_size: int, max_model_len: int,
               enable_caching: bool = True, sliding_window: int | None = None,
               enable_kv_cache_events: bool = False, hash_algo: HashAlgo = "sha256_cbor",
               hash_seed: str | int | None = None, *, log_stats: bool = False,
               keep_events: bool = True, engine: Engine | None = None,
               max_in_flight_tokens: int | None = None) -> None:
        if sliding_window is not None and (isinstance(sliding_window, bool)
                                           or not isinstance(sliding_window, int)
                                           or sliding_window < 2):
            raise ValueError(f"sliding_window must be an int >= 2 or None, got {sliding_window!r}")
        if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) \
                or max_model_len <= 0:
            raise ValueError(f"max_model_len must be a positive int, got {max_model_len!r}")
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.sliding_window = sliding_window
        self.enable_kv_cache_events = enable_kv_cache_events
        self.hash_algo: HashAlgo = hash_algo
        self.hash_seed = hash_seed
        self.log_stats = log_stats
        self.block_pool = BlockPool(num_blocks, enable_caching, block_size, enable_kv_cache_events,
                                    hash_seed=hash_seed, hash_algo=hash_algo,
                                    max_blocks_per_request=cdiv(max_model_len, block_size) + 1,
                                    keep_events=keep_events, engine=engine)
        self.engine = self.block_pool.engine
        self.running: dict[str, Running] = {}  # vLLM's num_cached_block (+ tree memo)
        self._covered: dict[str, int] = {}  # verified tokens the last allocation gave slots to
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.empty_kv_cache_blocks = EMPTY_BLOCKS
        self.kv_cache_spec_kind = "full_attention" if sliding_window is None else "sliding_window"
        # vLLM's sliding-window admission cap (full-sequence check); in-flight tokens default
        # to max_model_len, as in vLLM.
        in_flight = max_model_len if max_in_flight_tokens is None else \
            non_negative_int("max_in_flight_tokens", max_in_flight_tokens)
        self.admission_cap = None if sliding_window is None else \
            cdiv(min(sliding_window - 1 + in_flight, max_model_len), block_size) + 1

    # -- reading ------------------------------------------------------------------
    @property
    def usage(self) -> float:
        """The pool's usage (see ``BlockPool.get_usage``).  Commits nothing."""
        return self.block_pool.get_usage()

    def _table(self, request_id: str) -> Sequence[int]:
        record = self.engine.view.requests.get(request_id)
        return () if record is None else record.pages

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's block table as block views (null blocks included).  Commits nothing."""
        blocks = self.block_pool.blocks
        table = self._table(request_id)
        if not table:
            return EMPTY_BLOCKS
        return KVCacheBlocks((tuple(blocks[page] for page in table),))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block table as ids, per group (0: null block).  Commits nothing."""
        return (list(self._table(request_id)),)

    def prefix_cache_lookup_enabled(self, request: Request) -> bool:
        """Whether ``get_computed_blocks`` looks the request up at all.  Commits nothing."""
        return self.enable_caching and not request.skip_reading_prefix_cache

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int, int]:
        """``(hit blocks, hit tokens, 0)``: the longest cached prefix, at most ``num_tokens - 1``.

        Commits nothing (nothing is touched); the third value is vLLM 0.33's
        shared-prefix boundary, always 0 for one group.  Statistics are recorded
        separately, at admission (``record_prefix_cache_stats``).
        """
        self._check_request(request)
        if not self.prefix_cache_lookup_enabled(request):
            return EMPTY_BLOCKS, 0, 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        pages = cached_prefix(self.engine.view, request, max_blocks, self.sliding_window)
        if not pages:
            return EMPTY_BLOCKS, 0, 0
        blocks = self.block_pool.blocks
        return KVCacheBlocks((tuple(blocks[page] for page in pages),)), len(pages) * self.block_size, 0

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int,
                                   new_computed_blocks: Sequence[KVCacheBlock],
                                   total_computed_tokens: int) -> int:
        """How many free blocks the next allocation consumes (vLLM's predictor, exact).

        Commits nothing.
        """
        hits = [block.block_id for block in new_computed_blocks]
        return blocks_to_allocate(self.engine.view, request_id, request_id in self.running,
                                  num_tokens, hits, total_computed_tokens, self.sliding_window)

    # -- statistics ---------------------------------------------------------------------
    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        """Count an admitted request's lookup (vLLM's scheduler calls this once per admission).

        Nothing is counted without ``log_stats`` or when the request skipped
        the lookup (caching off, ``skip_reading_prefix_cache``).  Commits nothing.
        """
        if self.prefix_cache_stats is None or not self.prefix_cache_lookup_enabled(request):
            return
        self.prefix_cache_stats.record(request.num_tokens, num_hits, request.num_preemptions > 0)

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """The counters since the last call (then a fresh set starts); None without ``log_stats``.

        Commits nothing.
        """
        if self.prefix_cache_stats is None:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    # -- allocation -------------------------------------------------------------------
    def allocate_slots(self, request: Request, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks: KVCacheBlocks | None = None,
                       num_lookahead_tokens: int = 0, *,
                       full_sequence_must_fit: bool = False) -> KVCacheBlocks | None:
        """Give the request slots for its new tokens; None (and no allocation) when short.

        Commits, in vLLM 0.33's order: with ``full_sequence_must_fit`` (what
        vLLM's scheduler passes when it admits a request) nothing at all when
        the whole sequence would not fit (a sliding window counted at most its
        admission cap); then ``BlockRelease`` of out-of-window blocks
        (sliding window; it stays even when the call returns None), then, if
        the pool has room, ``ReqAlloc`` + ``BlockHold`` (the hits, nulls before
        them), ``BlockUncache`` + ``BlockAlloc`` (new blocks from the queue
        head) and ``BlockCache`` (full blocks up to ``min(computed + new,
        num_tokens)``).  Returns the newly allocated blocks.  Bad arguments
        raise ``ValueError`` / ``TypeError`` with nothing changed, among them
        a call past ``max_model_len`` and a call whose ``num_computed_tokens``
        the scheduler did not advance (vLLM 0.33 allocates nothing for those
        tokens and carries on silently; see docs/vllm.md).
        """
        self._check_request(request)
        request_id = request.request_id
        hits: list[int] | None = None
        if new_computed_blocks is not None and new_computed_blocks is not EMPTY_BLOCKS:
            hits = self.block_pool.ids_of(checked_blocks(new_computed_blocks).blocks[0],
                                          keep_null=True)
        running = self.running.get(request_id)
        num_local = check_allocation(request, num_new_tokens, num_new_computed_tokens,
                                     num_lookahead_tokens, len(hits or ()), self.block_size,
                                     self.max_model_len, self._covered.get(request_id, 0),
                                     running_with_hits=running is not None and bool(hits))
        need_slots = min(num_local + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        cache_upto = min(num_local + num_new_tokens, request.num_tokens)
        if hits is None and not full_sequence_must_fit and self.sliding_window is None and \
                allocation_is_idle(self.engine.view, request_id, request, running,
                                   need_slots=need_slots, cache_upto=cache_upto,
                                   caching=self.enable_caching):
            self._covered[request_id] = cache_upto  # a decode step inside a block: no change
            return EMPTY_BLOCKS
        with CallBatch(self.engine, self.block_pool.hashes, request) as b:
            done = plan_allocate_slots(
                b, request_id, request, running, hits, num_local=num_local,
                need_slots=need_slots, cache_upto=cache_upto,
                remove_upto=max(0, num_local - request.num_in_flight_tokens),
                window=self.sliding_window, caching=self.enable_caching,
                full_tokens=min(request.num_tokens, self.max_model_len)
                if full_sequence_must_fit else None, cap=self.admission_cap)
            # Book-keeping inside the batch: a listener failing at its commit raises after
            # the events are applied, and these counters must follow them.
            if done is not None:
                if done.running is not None:
                    self.running[request_id] = done.running
                self._covered[request_id] = cache_upto
        if done is None:
            return None
        if not done.new_pages:
            return EMPTY_BLOCKS
        blocks = self.block_pool.blocks
        return KVCacheBlocks((tuple(blocks[page] for page in done.new_pages),))

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the request's full blocks up to ``num_tokens`` (vLLM's ``cache_blocks``).

        Commits one ``BlockCache`` when there is a new full block.
        """
        self._check_request(request)  # its hashes must be the ones the tree is keyed by
        request_id = request.request_id
        with CallBatch(self.engine, self.block_pool.hashes, request) as b:
            running = plan_cache_blocks(b, request_id, request, self.running.get(request_id),
                                        num_tokens)
            if running is not None:
                self.running[request_id] = running

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Replace out-of-window blocks with the null block and free them, highest index first.

        Commits ``BlockRelease`` (sliding window only).
        """
        non_negative_int("num_computed_tokens", num_computed_tokens)
        with CallBatch(self.engine) as b:
            plan_remove_skipped(b, request_id, num_computed_tokens, window=self.sliding_window,
                                caching=self.enable_caching)

    # -- release ------------------------------------------------------------------------
    def free(self, request: Request | str) -> None:
        """Free the request's blocks in reverse order (tail blocks evicted first) and forget it.

        Commits ``BlockRelease`` closing the request's table (when it has one).
        """
        request_id = request_id_of(request)
        with CallBatch(self.engine) as b:
            plan_free_request(b, request_id, caching=self.enable_caching)
            self.running.pop(request_id, None)
            self._covered.pop(request_id, None)

    def evict_blocks(self, block_ids: set[int]) -> None:
        """Uncache the given blocks; commits ``BlockUncache`` (see ``BlockPool.evict_blocks``)."""
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        """Drop the whole prefix cache (commits ``BlockClear``) when no block is in use.

        A success marks the current statistics ``reset``.
        """
        if not self.block_pool.reset_prefix_cache():
            return False
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the pool's events, annotating each ``BlockStored`` with the group's spec.

        Commits nothing.
        """
        events = self.block_pool.take_events()
        out: list[KVCacheEvent] = []
        for event in events:
            if isinstance(event, BlockStored) and event.group_idx == 0:
                event = with_spec(event, self.kv_cache_spec_kind, self.sliding_window)
            out.append(event)
        return out

    def new_step_starts(self) -> None:
        """vLLM's scheduler calls this at the start of every step; one full-attention or
        sliding-window group keeps no per-step state.  Commits nothing."""

    def _check_request(self, request: Request) -> None:
        if request.block_size != self.block_size:
            raise ValueError(f"request block_size {request.block_size} differs from the "
                             f"manager's {self.block_size}")
        if request.hash_seed != self.hash_seed or request.hash_algo != self.hash_algo:
            raise ValueError("request hash_seed/hash_algo differ from the manager's")

