"""Drive a trace through the real planner and reducer, one request at a time.

For each request, in stream order (file order breaks arrival-time ties):

1. admit: ``plan_match`` the prompt, open a row, lock the matched node, map
   the matched slots (``Assign``), then ``plan_extend`` to the prompt length.
   ``plan_extend`` evicts exactly the page deficit with the chosen policy;
   if even that cannot make room the request is *rejected* (counted, its
   row closed, nothing cached).
2. decode: ``plan_extend`` by the output length (one batched allocation;
   with one request in flight this uses the same pages as step-by-step
   decode).  If the pool runs out the request is *retracted*: it finishes
   with what it has.
3. finish: ``plan_release`` with checkpointing caches the prompt (and the
   output with ``cache_output``), frees the rest and unlocks.

Hits are looked up at admission and count the longest contiguous cached
prefix only.  In ``block`` granularity one page holds one trace hash block
and each block is weighted by its own token count (so a partial last block
counts its tokens); in ``token`` granularity the synthetic token ids are used
with pages of ``page_size`` tokens.

The ``Engine`` built here is the only mutable state besides the counters; an
optional ``Recorder`` writes every event to a kvstate log.  By default requests
run one at a time in stream order (arrival times unused); with
``settings.max_running`` the run is handed to ``batching.BatchingSimulator``,
which replays arrival times with continuous batching.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from kvstate.engine import Engine
from kvstate.events import Assign, Evict, Lock, ReqAlloc, Split
from kvstate.planner.alloc import plan_extend
from kvstate.planner.policy import EvictionPolicy, load_policy
from kvstate.planner.requests import RequestCursor, plan_release
from kvstate.planner.tree_ops import plan_match
from kvstate.simulate.point import (
    PointSimulator,
    ProgressCallback,
    run_point,
)
from kvstate.simulate.policies import VLLM_POLICY
from kvstate.simulate.settings import SimulationResult, SimulationSettings
from kvstate.state import ROOT, Geometry, RequestId
from kvstate.traces.records import TraceRequest
from kvstate.traces.tokens import full_block_tokens, partial_block_tokens, private_tokens


def block_units(request: TraceRequest) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """One id per hash block (plus one for an unhashed tail) and the tokens each covers."""
    size = request.block_size
    ids: list[int] = []
    for key, count in zip(request.block_keys, request.block_token_counts, strict=True):
        block = full_block_tokens(key, size) if count == size else partial_block_tokens(key, size, count)
        ids.append(block.start)
    weights = list(request.block_token_counts)
    if request.private_tail:
        ids.append(private_tokens(request.sequence, 1).start)
        weights.append(request.private_tail)
    return tuple(ids), tuple(weights)


@attrs.frozen
class Admitted:
    """A request that holds a row: its cursor, full key (prompt + private output ids)."""

    index: int
    request: TraceRequest
    cursor: RequestCursor
    full_key: tuple[int, ...]
    prompt_units: int
    measured: bool


class TraceSimulator(PointSimulator):
    """One capacity point.  ``run`` consumes requests and returns a ``SimulationResult``.

    Owns its ``Engine`` and policy object; each instance runs once.
    """

    def __init__(
        self,
        settings: SimulationSettings,
        unit_tokens: int,
        trace_name: str,
        page_bound: int | None = None,
    ) -> None:
        self._init_point(settings, unit_tokens, trace_name, page_bound)
        page_size = 1 if settings.granularity == "block" else settings.page_size
        self.engine = Engine(Geometry(num_pages=self.pool_pages, page_size=page_size), keep_events=False)
        self.policy: EvictionPolicy = load_policy(settings.policy)
        self.page_size = page_size
        self.engine.subscribe(self)

    # -- the engine listener: the policy observes every batch; evicted pages are counted ------
    def before(self, event: Any, view: Any) -> None:
        if type(event) is Evict:
            nodes = view.nodes
            self.counters.evicted += sum(len(nodes[n].pages) for n in event.nodes if n in nodes)

    def discard(self, event: Any) -> None:  # the count above only follows applied events
        if type(event) is Evict:  # pragma: no cover - the planner emits only valid evictions
            raise RuntimeError("an eviction was refused after it was counted")

    def after(self, events: Sequence[Any], view: Any) -> None:
        self.policy.observe(events)

    def _apply(self, event: Any) -> None:
        self.engine.apply(event)

    def extend_to(self, request_id: RequestId, length: int) -> bool:
        """Grow a request's row to ``length`` units (evicting the deficit); False if it cannot."""
        with self.engine.batch() as batch:
            slots = plan_extend(batch, [(request_id, length)],
                                at_head=self.policy.at_head(batch.state),
                                victims=self.policy.victims)
        if slots is None:
            return False
        state = self.engine.view
        self.counters.peak = max(self.counters.peak, self.pool_pages - len(state.free_pages))
        return True

    def extend_active(self, active: Admitted, length: int) -> bool:
        """``extend_to`` for an admitted request (the step ``BatchingSimulator`` calls)."""
        return self.extend_to(active.cursor.request, length)

    def _split_to_pages(self, key: Sequence[int]) -> None:
        """Split every node on ``key``'s cached path into one-page nodes (per-block trie)."""
        size = self.page_size
        position, node_id = 0, ROOT
        while position < len(key):
            state: Any = self.engine.view
            child = state.nodes[node_id].children.get(state.geometry.child_key(tuple(key[position:])))
            if child is None:
                return
            while len(state.nodes[child].key) > size:
                top = state.next_node_id
                self._apply(Split(child, size, top, state.clock))
                state = self.engine.view
                position += size
                node_id = top
            position += len(state.nodes[child].key)
            node_id = child

    # -- one request ---------------------------------------------------------------------------
    def _encode(self, request: TraceRequest) -> tuple[tuple[int, ...], tuple[int, ...] | None, int]:
        if self.settings.granularity == "block":
            key, weights = block_units(request)
            total_units = -(-(request.prompt_length + request.output_length) // self.unit_tokens)
            output_units = max(0, total_units - len(key)) if self.settings.decode else 0
            return key, weights, output_units
        return request.token_ids(), None, request.output_length if self.settings.decode else 0

    def _measure(self, key: Sequence[int], weights: tuple[int, ...] | None, matched: int) -> None:
        if weights is not None:  # block granularity: one unit per hash block (len(key) units)
            self._measure_units(weights, matched)
            return
        size = self.page_size
        self._measure_counts(matched, len(key), matched // size, -(-len(key) // size))

    def admit(
        self, index: int, request: TraceRequest, measured: bool, count_if_refused: bool = True
    ) -> Admitted | None:
        """Match, open the row, lock, map the hit and allocate the prompt.

        Returns ``None`` (after undoing the row, nothing cached) when the pool
        cannot hold the prompt even after evicting everything evictable.  A
        measured request's hit is counted at its lookup, refused or not,
        unless ``count_if_refused`` is False (a request that will retry).
        """
        key, weights, output_units = self._encode(request)
        with self.engine.batch() as batch:
            match = plan_match(batch, key)
        request_id = f"q{index}"
        self._apply(ReqAlloc((request_id,)))
        if match.last_node != ROOT:
            self._apply(Lock(match.last_node))
        if match.length:
            self._apply(Assign(request_id, 0, match.slots))
        cursor = RequestCursor(request_id, match.length, match.last_node)
        admitted = self.extend_to(request_id, len(key))
        if measured and (admitted or count_if_refused):
            self._measure(key, weights, match.length)
        if not admitted:
            self._release(cursor, key, len(key), match.length, checkpoint=False)
            return None
        tail = private_tokens(request.sequence, output_units, request.private_tail)
        return Admitted(index, request, cursor, (*key, *tail), len(key), measured)

    def finish(self, active: Admitted, decoded_units: int) -> None:
        """Cache the prompt (and the decoded output with ``cache_output``), free the rest."""
        owned = active.prompt_units + (decoded_units if self.settings.cache_output else 0)
        if (
            not self.counters.filled
            and not active.measured
            and self.pool_pages == self.capacity_pages
            and len(self.engine.view.free_pages) == 0
        ):
            self.counters.filled = True
        self._release(active.cursor, active.full_key, active.prompt_units, owned, checkpoint=True)
        if self.settings.eviction_unit == "page":
            self._split_to_pages(active.full_key[:owned])

    def step(self, index: int, request: TraceRequest, measured: bool) -> None:
        """Admit, decode and finish ``request`` alone (the ``index``-th of the stream)."""
        self.counters.requests += 1
        active = self.admit(index, request, measured)
        if active is None:
            self.counters.rejected += 1
            return
        decoded = len(active.full_key) - active.prompt_units
        if decoded and not self.extend_to(active.cursor.request, len(active.full_key)):
            self.counters.retracted += 1
            decoded = 0
        self.finish(active, decoded)

    def _release(
        self, cursor: RequestCursor, key: Sequence[int], prompt_len: int, owned: int, checkpoint: bool
    ) -> None:
        with self.engine.batch() as batch:
            plan_release(batch, cursor, key, prompt_len=prompt_len, owned=owned,
                         checkpoint=checkpoint, at_head=self.policy.at_head(batch.state))


def simulate(
    requests: Iterable[TraceRequest],
    settings: SimulationSettings,
    request_count: int,
    *,
    record: str | Path | None = None,
    progress: ProgressCallback | None = None,
    page_bound: int | None = None,
) -> SimulationResult:
    """Run one capacity point over ``requests`` (consumed once, streamed).

    ``request_count`` is the stream's length (the warmup window needs it).
    With ``record`` every event is written to a kvstate log at that path.
    ``page_bound`` (see ``pages_needed``) caps the pool actually built, which
    keeps "infinite" capacities cheap without changing any result.
    ``settings.policy == "vllm"`` runs vLLM's free-queue LRU instead
    (``kvstate.simulate.vllm_driver``: the block-mode core, not the radix planner).
    """
    if settings.policy == VLLM_POLICY:
        from kvstate.simulate.vllm_driver import VllmTraceSimulator

        make: Any = VllmTraceSimulator
    else:
        make = TraceSimulator
    return run_point(make, requests, settings, request_count, record=record,
                     progress=progress, page_bound=page_bound)


def pages_needed(requests: Iterable[TraceRequest], settings: SimulationSettings, unit_tokens: int) -> int:
    """An upper bound on the pages a run can occupy: every page of every request, once.

    A pool this large never evicts, so any larger capacity gives the same result.
    """
    total = 0
    for request in requests:
        if settings.granularity == "block":
            total += -(-(request.prompt_length + request.output_length) // unit_tokens) + 1
        else:
            total += -(-request.prompt_length // unit_tokens) + -(-request.output_length // unit_tokens) + 1
    return total
