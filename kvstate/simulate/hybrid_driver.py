"""Drive a trace through SGLang 0.5.23's hybrid cache (``kvstate.sglang``), one request at a time.

Each request runs the scheduler's calls on the kvstate front end, in
0.5.23's order (``kvstate.sglang.hybrid_scheduler`` for FULL + SWA,
``kvstate.sglang.mamba_scheduler`` with Mamba): admission (match up to the
prompt's last unit, lock, evict each pool's shortfall, allocate; with Mamba
also the state slots and copy-on-match), chunked prefill with a checkpoint
per chunk, the first output token and the unfinished checkpoint, one decode
step per output unit, and the finish, which caches prompt and output.
``hybrid_scheduler.admit`` has no chunked prefill, so the FULL + SWA
admission is its page-size-1 body with the extend cut at the chunk, and
each later chunk is allocated the same way after ``checkpoint_kv_cache``.
So a hit is what SGLang's validators allow: with SWA, a full window of live
SWA KV must end at the hit; with Mamba, the hit's node must hold a state.
The match's FULL reach (``full_kv_hit_length``: the cached prefix the full
layers alone would allow) is counted beside it.

A *unit* of ``unit_tokens`` (64) tokens stands for one page: the trace's
synthetic token ids at every 64th position, so two prompts share a unit iff
they share its tokens (the trace's blocks are whole units; a partial last
block is its own, shorter unit, weighted by its tokens).  Windows, Mamba
chunks, the track interval and the prefill chunk are rounded up to units.
Pools are built no larger than the trace can fill (``page_bound``; Mamba
slots at most one per cached unit plus the rows'), so memory follows the
trace, not the budget.

``rule="full"`` runs the same front end with the window longer than any
request and the SWA pool as large as the FULL pool, so no window ever
binds: the full-attention rule on the same code path.

Ownership: each ``SglangHybridSimulator`` builds and owns one engine, its
pools and its tree for one run; every decision (what matches, what is
evicted, which slot a state takes) is the front end's (``kvstate.sglang``),
and this module only calls it in the scheduler's order and counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import attrs

from kvstate.events import Evict
from kvstate.simulate.hybrid_pools import MAMBA_SLOTS_HELD
from kvstate.simulate.point import PointSimulator, SimulationError
from kvstate.simulate.settings import SimulationSettings
from kvstate.simulate.units import UNIT_TOKENS, unit_key, units_of
from kvstate.traces.records import TraceRequest
from kvstate.traces.tokens import private_tokens

CHUNKED_PREFILL_TOKENS = 8192  # SGLang 0.5.23's chunked_prefill_size on 60 to 160 GiB GPUs
MAMBA_TRACK_INTERVAL = 256  # SGLang 0.5.23's mamba_track_interval
ROWS = 2

Rule = Literal["hybrid", "full"]


@attrs.frozen
class DriverPlan:
    """The pools and grids of one run, in units."""

    rule: Rule
    full_units: int
    width: int  # row width: the most units one request ever holds
    swa_units: int = 0
    window_units: int | None = None
    mamba_slots: int = 0
    mamba_chunk_units: int = 1
    track_units: int = MAMBA_TRACK_INTERVAL // UNIT_TOKENS
    prefill_chunk_units: int = CHUNKED_PREFILL_TOKENS // UNIT_TOKENS

    @property
    def has_swa(self) -> bool:
        return self.window_units is not None

    @property
    def has_mamba(self) -> bool:
        return self.mamba_slots > 0


class SglangHybridSimulator(PointSimulator):
    """One run of ``plan`` over a request stream (``run`` returns a ``SimulationResult``)."""

    def __init__(self, settings: SimulationSettings, unit_tokens: int, trace_name: str,
                 page_bound: int | None, plan: DriverPlan) -> None:
        self._init_point(settings, unit_tokens, trace_name, page_bound)
        if plan.full_units < 1:
            raise SimulationError("the full-attention pool holds less than one unit")
        self.plan = plan
        self.reach_tokens = 0
        self._last_match: Any = None
        self.cache = self._build()
        self.engine = self.cache.engine
        self.engine.subscribe(self)

    def _build(self) -> Any:
        """The request pool first, then the allocator (it joins the pool's engine), then the tree."""
        from kvstate.sglang.unified_radix_cache import UnifiedRadixCache

        plan, full = self.plan, self.pool_pages
        paired = plan.rule == "full" or plan.has_swa
        swa = full if plan.rule == "full" else min(plan.swa_units, full)
        window = plan.width if plan.rule == "full" else plan.window_units
        mamba = plan.rule == "hybrid" and plan.has_mamba
        pool: Any
        if mamba:
            from kvstate.sglang.mamba_pool import HybridReqToTokenPool

            # At most one state per tree node (a node holds >= 1 page) plus what the rows hold:
            # more slots than that are never used, so the pool is built no larger.
            slots = min(plan.mamba_slots, full + ROWS * MAMBA_SLOTS_HELD + 1)
            pool = HybridReqToTokenPool(size=ROWS, mamba_size=slots,
                                        max_context_len=plan.width, enable_mamba_extra_buffer=True)
        else:
            from kvstate.sglang.pool import ReqToTokenPool

            pool = ReqToTokenPool(ROWS, plan.width)
        allocator: Any
        if paired:
            from kvstate.sglang.swa_allocator import SWATokenToKVPoolAllocator

            allocator = SWATokenToKVPoolAllocator(full, max(swa, 1), 1)
        else:
            from kvstate.sglang.allocator import TokenToKVPoolAllocator

            allocator = TokenToKVPoolAllocator(full)
        cache: Any
        if mamba:
            from kvstate.sglang.mamba_radix_cache import MambaCacheInitParams

            components = ("FULL", "SWA", "MAMBA") if plan.has_swa else ("FULL", "MAMBA")
            cache = UnifiedRadixCache(MambaCacheInitParams(
                req_to_token_pool=pool, token_to_kv_pool_allocator=allocator, page_size=1,
                sliding_window_size=window, tree_components=components,
                enable_mamba_extra_buffer=True, mamba_chunk_size=plan.mamba_chunk_units,
                mamba_track_interval=plan.track_units))
        else:
            from kvstate.sglang.hybrid_req import HybridCacheInitParams

            cache = UnifiedRadixCache(HybridCacheInitParams(pool, allocator, 1, window))
        match = cache.match_prefix

        def recording_match(params: Any) -> Any:
            self._last_match = result = match(params)
            return result

        setattr(cache, "match_prefix", recording_match)  # noqa: B010 - records each match's reach
        return cache

    # -- the engine listener: evicted FULL pages and the peak ---------------------------------
    def before(self, event: Any, view: Any) -> None:
        if type(event) is Evict:
            nodes = view.nodes
            self.counters.evicted += sum(len(nodes[n].pages) for n in event.nodes if n in nodes)

    def discard(self, event: Any) -> None:  # pragma: no cover - the planner emits valid events
        if type(event) is Evict:
            raise RuntimeError("an eviction was refused after it was counted")

    def after(self, events: Sequence[Any], view: Any) -> None:
        self.counters.peak = max(self.counters.peak, self.pool_pages - len(view.free_pages))

    # -- one request ---------------------------------------------------------------------------
    def step(self, index: int, request: TraceRequest, measured: bool) -> None:
        self.counters.requests += 1
        unit = self.unit_tokens
        ids, weights = unit_key(request, unit)
        outputs = 0
        if self.settings.decode:
            outputs = max(0, units_of(request.prompt_length + request.output_length, unit) - len(ids))
        req, hit = self._admit(index, ids)
        if measured:
            self._measure_units(weights, hit)
            reach = self._last_match.full_kv_hit_length if self._last_match is not None else 0
            self.reach_tokens += sum(weights[:reach])
        if req is None:
            self.counters.rejected += 1
            return
        scheduler = self._scheduler()
        first = private_tokens(request.sequence, 1, request.prompt_length).start
        scheduler.prefill_done(self.cache, req, first, finished=outputs <= 1)
        for step in range(1, outputs):
            token = private_tokens(request.sequence, 1, request.prompt_length + step * unit).start
            try:
                scheduler.decode_step(self.cache, [req], token)
            except MemoryError:
                self.counters.retracted += 1
                break
        if (not measured and not self.counters.filled and self.pool_pages == self.capacity_pages
                and len(self.engine.view.free_pages) == 0):
            self.counters.filled = True  # the pool filled before the measured window began
        scheduler.finish(self.cache, req)

    def _scheduler(self) -> Any:
        if self.plan.rule == "hybrid" and self.plan.has_mamba:
            from kvstate.sglang import mamba_scheduler

            return mamba_scheduler
        from kvstate.sglang import hybrid_scheduler

        return hybrid_scheduler

    def _admit(self, index: int, ids: list[int]) -> tuple[Any, int]:
        """Admit and prefill: the request and its hit in units (``None``, nothing held, when
        the prompt does not fit)."""
        self._last_match = None
        if self.plan.rule == "hybrid" and self.plan.has_mamba:
            return self._admit_mamba(index, ids)
        from kvstate.sglang.hybrid_req import HybridReq
        from kvstate.sglang.hybrid_scheduler import undo_admit
        from kvstate.sglang.unified_flows import checkpoint_kv_cache

        chunk = self.plan.prefill_chunk_units
        req = HybridReq(index, ids)
        try:
            self._admit_swa(req, chunk)
        except MemoryError:
            undo_admit(self.cache, req)
            return None, req.prefix_len
        hit = req.prefix_len
        while req.extend_end < len(ids):
            checkpoint_kv_cache(req, self.cache)
            try:
                self._extend_swa(req, min(len(ids), req.extend_end + chunk))
            except MemoryError:
                req.finished_reason = "abort"
                self.cache.release_kv_cache(req, checkpoint=False)
                return None, hit
        return req, hit

    def _admit_swa(self, req: Any, chunk: int) -> None:
        """``hybrid_scheduler.admit`` (page size 1) for the first ``chunk`` units past the hit:
        match up to the prompt's last unit, lock, take a row, write the hit, extend."""
        import torch

        from kvstate.sglang.params import MatchPrefixParams, RadixKey

        cache, fill = self.cache, req.full_untruncated_fill_ids
        found = cache.match_prefix(MatchPrefixParams(key=RadixKey(fill, limit=len(fill) - 1)))
        req.prefix_len = req.kv.cache_protected_len = found.device_prefix_len
        req.last_node = found.last_device_node
        req.swa_branching_seqlen = found.swa_branching_seqlen
        req.lock = cache.lock(req.last_node)
        rows = cache.req_to_token_pool.alloc(1)
        if not rows:  # pragma: no cover - one request at a time never runs out of rows
            raise MemoryError("no free request row")
        req.kv.req_pool_idx = rows[0]
        if req.prefix_len:
            prefix = cache.prefix_device_indices(req)
            cache.req_to_token_pool.write((rows[0], slice(0, req.prefix_len)), prefix.to(torch.int32))
        req.kv.kv_allocated_len = req.prefix_len
        self._extend_swa(req, min(len(fill), req.prefix_len + chunk))

    def _extend_swa(self, req: Any, end: int) -> None:
        """Allocate row positions ``[kv_allocated_len, end)`` after evicting each pool's
        shortfall (``MemoryError`` when they do not fit) and write them into the row."""
        import torch

        cache, start = self.cache, req.kv.kv_allocated_len
        allocator = cache.token_to_kv_pool_allocator
        allocator.evict_to_free_tokens(cache, end - start)
        out = allocator.alloc(end - start)
        if out is None:
            raise MemoryError("prefill out of memory")
        cache.req_to_token_pool.write((req.kv.req_pool_idx, slice(start, end)), out.to(torch.int32))
        req.kv.kv_allocated_len = req.kv.kv_committed_len = req.extend_end = end

    def _admit_mamba(self, index: int, ids: list[int]) -> tuple[Any, int]:
        from kvstate.sglang.mamba_req import MambaReq
        from kvstate.sglang.mamba_scheduler import abort, admit, extend_chunk, undo_admit
        from kvstate.sglang.unified_flows import checkpoint_kv_cache

        chunk = self.plan.prefill_chunk_units
        req = MambaReq(index, ids)
        try:
            admit(self.cache, req, chunk=chunk)
        except MemoryError:
            undo_admit(self.cache, req)
            return None, req.prefix_len
        hit = req.prefix_len
        while req.extend_end < len(ids):
            checkpoint_kv_cache(req, self.cache)
            try:
                extend_chunk(self.cache, req, chunk)
            except MemoryError:
                abort(self.cache, req)
                return None, hit
        return req, hit


__all__ = ["CHUNKED_PREFILL_TOKENS", "DriverPlan", "MAMBA_TRACK_INTERVAL", "ROWS",
           "SglangHybridSimulator"]
