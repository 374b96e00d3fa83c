"""``--policy vllm``: drive a trace through vLLM's KV-cache manager on the block-mode core.

The other policies order the leaves of a radix tree (``driver.TraceSimulator``).
vLLM V1 has no leaf order: its pool is a free queue.  This driver therefore
runs each request through ``kvstate.vllm.KVCacheManager`` (which applies
block events, ``BlockHold`` / ``BlockUncache`` / ``BlockAlloc`` /
``BlockCache`` / ``BlockRelease``, to a block-mode ``Engine`` through the real
reducer), as vLLM 0.33's scheduler calls it.  One request at a time (the
default), each request goes through:

1. admit: ``get_computed_blocks`` (the longest cached prefix, at most
   ``floor((prompt - 1) / B)`` blocks: vLLM always recomputes the last
   prompt token), then ``allocate_slots`` for the prompt: the hits are
   touched (a hit on a free cached block takes it out of the free queue),
   new blocks are popped from the free-queue head, evicting a cached block
   lazily when it is reused, and the full blocks are cached.  ``None`` means
   the prompt cannot fit even in an empty pool: the request is *rejected*.
2. decode: ``allocate_slots`` for the output tokens whose KV is computed
   (``output - 1``: the last sampled token never is); the blocks they fill
   are cached too, under keys no other request shares.  ``None``: *retracted*.
3. finish: ``free`` releases the blocks tail first; cached ones join the
   free-queue tail (the chain tail ahead of its prefix, so tails are evicted
   first), uncached ones (a partial last block) the head.

With ``max_running`` the same steps (``admit``, ``extend_active``,
``finish``) are driven by ``batching.BatchingSimulator``: prompt blocks are
cached at prefill, so later requests share blocks a running request holds,
and decode grows a request one block at a time.

**Block identity.**  One core page is one trace hash block (``B`` tokens,
512 for Mooncake).  The manager runs with ``block_size=1`` on *units*: the
unit of a full trace block is the block's trace key (``block_units``),
which already names its whole prefix, so a prefix-tree path of units is the
hash chain vLLM would build; each unit's chained block hash (the real
``hash_block_tokens``) is computed from the units, never from 512 synthetic
token ids.  Only full blocks carry a hash, as in vLLM: a partial last prompt
block is never cached (it never hits), and when decoding fills it, it gets a
key private to the request.  Hit tokens weight each hit block by its tokens.

The driver owns its manager and counters and mutates only them; an optional
``Recorder`` writes every block event, and the log replays with
``kvstate replay``.
"""

from __future__ import annotations

from typing import Any

from kvstate.events import BlockUncache, Event
from kvstate.simulate.driver import block_units
from kvstate.simulate.point import (
    PointSimulator,
    SimulationError,
)
from kvstate.simulate.policies import VLLM_POLICY
from kvstate.simulate.settings import SimulationSettings
from kvstate.state import block_child_key
from kvstate.traces.records import TraceRequest
from kvstate.traces.tokens import private_tokens
from kvstate.vllm.hashing import hash_block_tokens, none_hash
from kvstate.vllm.manager import KVCacheManager

__all__ = ["VLLM_POLICY", "UnitRequest", "VllmTraceSimulator"]


class UnitRequest:
    """A trace request as ``KVCacheManager`` reads it, in units of one block (``block_size=1``).

    ``units`` are the request's blocks (trace keys, then private ids for the
    output); only the first ``hashed`` are full blocks with a block hash.
    Mutated by the driver (``grow``) and by the manager's scheduler cursor
    ``num_computed_tokens``.
    """

    block_size = 1
    hash_seed: str | int | None = None
    hash_algo = "sha256_cbor"
    lora_id = None
    skip_reading_prefix_cache = False
    num_in_flight_tokens = 0

    def __init__(self, request_id: str, units: list[int], hashed: int) -> None:
        self.request_id = request_id
        self.units = units
        self.num_computed_tokens = 0
        self.block_hashes: list[bytes] = []
        self.block_keys: list[tuple[Any, ...]] = []
        self.block_extra_keys: list[None] = []
        self._none_hash = none_hash(None, "sha256_cbor")
        self._hash_up_to(hashed)

    @property
    def num_tokens(self) -> int:
        return len(self.units)

    def block_tokens(self, index: int) -> tuple[int, ...]:
        return (self.units[index],)

    def grow(self, units: list[int], hashed: int, replace_last: int | None = None) -> None:
        """Append output units; ``replace_last`` re-keys the partial prompt block decoding filled."""
        if replace_last is not None:
            self.units[len(self.block_hashes)] = replace_last
        self.units.extend(units)
        self._hash_up_to(hashed)

    def _hash_up_to(self, hashed: int) -> None:
        parent = self.block_hashes[-1] if self.block_hashes else self._none_hash
        for index in range(len(self.block_hashes), hashed):
            key = (self.units[index],)
            parent = hash_block_tokens(parent, key, None, hash_seed=None, hash_algo="sha256_cbor")
            self.block_hashes.append(parent)
            self.block_keys.append(block_child_key(key))
            self.block_extra_keys.append(None)


class VllmActive:
    """A request holding blocks in the manager (the driver's handle; mutated by the driver)."""

    __slots__ = ("index", "request", "unit_request", "weights", "prompt_units", "measured")

    def __init__(
        self, index: int, request: TraceRequest, unit_request: UnitRequest, weights: tuple[int, ...],
        measured: bool,
    ) -> None:
        self.index = index
        self.request = request
        self.unit_request = unit_request
        self.weights = weights
        self.prompt_units = len(weights)
        self.measured = measured


class VllmTraceSimulator(PointSimulator):
    """One capacity point under vLLM's free-queue LRU.

    ``run`` replays one request at a time; ``admit`` / ``extend_active`` /
    ``finish`` are the steps ``batching.BatchingSimulator`` drives under
    ``max_running``.  Owns its manager and counters; each instance runs once.
    """

    def __init__(
        self,
        settings: SimulationSettings,
        unit_tokens: int,
        trace_name: str,
        page_bound: int | None = None,
    ) -> None:
        if settings.granularity != "block":
            raise SimulationError("--policy vllm needs block granularity (a trace with hash blocks)")
        self._init_point(settings, unit_tokens, trace_name, page_bound)
        self.manager = KVCacheManager(
            self.pool_pages + 1,  # + vLLM's null block 0
            1,
            max_model_len=1 << 40,
            keep_events=False,
        )
        self.engine = self.manager.engine
        self._warming = True
        self.engine.subscribe(self._count_evictions)

    def _count_evictions(self, event: Event, state: Any) -> None:
        if type(event) is BlockUncache:
            self.counters.evicted += len(event.pages)  # type: ignore[attr-defined]
            if self._warming:
                self.counters.filled = True

    def _note_peak(self) -> None:
        """Pages held or cached: every held page plus the cached pages nobody holds.

        A held page is one with a holder (not in the free queue); a cached page
        nobody holds sits in the free queue yet still takes room.  A page held
        by several requests (a shared prefix under batching) counts once.
        """
        state = self.engine.view
        holders = state.holders
        page_node = state.page_node
        held_cached = sum(1 for page in holders if page in page_node)
        occupied = len(holders) + len(page_node) - held_cached
        counters = self.counters
        counters.peak = max(counters.peak, occupied)
        if self._warming and occupied == self.pool_pages == self.capacity_pages:
            counters.filled = True

    # -- the steps --------------------------------------------------------------------------
    def admit(
        self, index: int, request: TraceRequest, measured: bool, count_if_refused: bool = True
    ) -> VllmActive | None:
        """Look up the prefix and allocate the prompt; ``None`` (nothing held) when it does not fit.

        A measured request's hit is counted at its lookup, refused or not,
        unless ``count_if_refused`` is False (a request that will retry).
        """
        self._warming = not measured
        size = self.unit_tokens
        units, weights = block_units(request)
        hashed = 0
        while hashed < len(weights) and weights[hashed] == size:
            hashed += 1
        unit_request = UnitRequest(f"q{index}", list(units), hashed)
        manager = self.manager
        hits, hit_units, _ = manager.get_computed_blocks(unit_request)  # type: ignore[arg-type]
        new_units = len(units) - hit_units
        admitted = manager.allocate_slots(unit_request, new_units, hit_units, hits) is not None  # type: ignore[arg-type]
        if measured and (admitted or count_if_refused):
            self._measure_units(weights, hit_units)
        if not admitted:
            manager.free(unit_request.request_id)
            return None
        unit_request.num_computed_tokens = len(units)
        self._note_peak()
        return VllmActive(index, request, unit_request, weights, measured)

    def extend_active(self, active: VllmActive, target_units: int, full_units: int | None = None) -> bool:
        """Grow the request to ``target_units`` blocks for its output; False if the pool is short.

        The output blocks get keys private to the request.  ``full_units``
        blocks (default: all but the newest) are full and get cached; a
        partial prompt block that output filled is re-keyed first.
        """
        unit_request = active.unit_request
        current = len(unit_request.units)
        full = target_units - 1 if full_units is None else full_units
        extra = max(0, target_units - current)
        hashed = len(unit_request.block_hashes)
        if not extra and full <= hashed:
            return True
        request = active.request
        # Private ids: offset 0 re-keys the partial prompt block, 1 + k is output block k.
        private = private_tokens(request.sequence, target_units - active.prompt_units + 1,
                                 request.private_tail)
        refill = None
        if hashed < active.prompt_units and full > hashed:
            refill = private[0]  # the partial prompt block, now full of other tokens
        output_ids = [private[1 + current - active.prompt_units + i] for i in range(extra)]
        unit_request.grow(output_ids, full, refill)
        if extra:
            if self.manager.allocate_slots(unit_request, extra) is None:  # type: ignore[arg-type]
                return False
        else:
            self.manager.cache_blocks(unit_request, full)  # type: ignore[arg-type]
        unit_request.num_computed_tokens = len(unit_request.units)
        self._note_peak()
        return True

    def finish(self, active: VllmActive, decoded_units: int = 0) -> None:
        """Free the request's blocks, tail first (cached ones to the queue tail)."""
        self.manager.free(active.unit_request.request_id)

    def step(self, index: int, request: TraceRequest, measured: bool) -> None:
        """Admit, decode and free ``request`` alone (the ``index``-th of the stream)."""
        self.counters.requests += 1
        active = self.admit(index, request, measured)
        if active is None:
            self.counters.rejected += 1
            return
        if self.settings.decode and request.output_length > 1:
            # KV is computed for all but the last sampled token.
            computed = request.prompt_length + request.output_length - 1
            total_units = max(active.prompt_units, -(-computed // self.unit_tokens))
            if not self.extend_active(active, total_units, computed // self.unit_tokens):
                self.counters.retracted += 1
        self.finish(active)
