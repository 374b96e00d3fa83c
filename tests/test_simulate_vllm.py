"""``kvstate simulate --policy vllm``: vLLM's free-queue LRU on the block-mode core.

The driver runs the trace through ``kvstate.vllm.KVCacheManager`` and the
block reducer; here it is checked against hand-computed outcomes where vLLM
and leaf LRU part ways, and against ``FreeQueueModel``, a small model of
vLLM 0.33's pool written independently below (a list as the free queue, a
dict of prefix -> cached copies).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstate.cli import main
from kvstate.simulate import SimulationSettings, simulate
from kvstate.traces import TraceRequest
from tests.trace_fixtures import BLOCK, chain_requests, reference_trace


class FreeQueueModel:
    """vLLM 0.33's block pool, one request at a time, written from its documented rules.

    Queue head = index 0.  Only full blocks are cached; a lookup takes the
    first cached copy of each prefix and stops at the first miss, capped at
    ``blocks - 1`` (the last prompt token is always recomputed); allocation
    pops the head and evicts a cached block there; a request frees tail
    first, cached blocks to the tail and uncached ones to the head.
    """

    def __init__(self, capacity: int) -> None:
        self.queue = list(range(1, capacity + 1))
        self.refs: dict[int, int] = {}
        self.copies: dict[tuple[int, ...], list[int]] = {}
        self.prefix_of: dict[int, tuple[int, ...]] = {}
        self.evicted = self.hit_tokens = self.total_tokens = self.hit_blocks = self.rejected = 0

    def run(self, request: TraceRequest, measured: bool = True) -> None:
        keys, counts = list(request.block_keys), list(request.block_token_counts)
        full = 0
        while full < len(counts) and counts[full] == request.block_size:
            full += 1
        hits: list[int] = []
        for position in range(min(len(keys) - 1, full)):
            found = self.copies.get(tuple(keys[: position + 1]))
            if not found:
                break
            hits.append(found[0])
        if measured:
            self.hit_tokens += sum(counts[: len(hits)])
            self.total_tokens += sum(counts)
            self.hit_blocks += len(hits)
        new = len(keys) - len(hits)
        if new + sum(1 for page in hits if self.refs.get(page, 0) == 0) > len(self.queue):
            self.rejected += 1
            return
        for page in hits:
            if self.refs.get(page, 0) == 0:
                self.queue.remove(page)
            self.refs[page] = self.refs.get(page, 0) + 1
        fresh, self.queue = self.queue[:new], self.queue[new:]
        for page in fresh:
            if page in self.prefix_of:
                self.copies[self.prefix_of.pop(page)].remove(page)
                self.evicted += 1
            self.refs[page] = 1
        table = hits + fresh
        for position in range(len(hits), full):
            prefix = tuple(keys[: position + 1])
            self.copies.setdefault(prefix, []).append(table[position])
            self.prefix_of[table[position]] = prefix
        to_head: list[int] = []
        for page in reversed(table):
            self.refs[page] -= 1
            if self.refs[page] == 0:
                (self.queue.append if page in self.prefix_of else to_head.append)(page)
        self.queue[:0] = to_head


def run_vllm(requests: list[TraceRequest], capacity: int, warmup: float = 0.0, decode: bool = False):  # type: ignore[no-untyped-def]
    run = SimulationSettings(capacity_tokens=capacity * BLOCK, policy="vllm", warmup=warmup, decode=decode)
    return simulate(requests, run, len(requests))


def run_lru(requests: list[TraceRequest], capacity: int):  # type: ignore[no-untyped-def]
    run = SimulationSettings(capacity_tokens=capacity * BLOCK, eviction_unit="page", decode=False)
    return simulate(requests, run, len(requests))


def test_a_partial_last_block_is_never_cached_so_it_never_hits() -> None:
    # Same prompt twice: one full block A plus 2 tokens.  Leaf LRU caches the
    # partial block too (6 of 6 tokens hit); vLLM caches full blocks only.
    requests = chain_requests([([0, 0], 2), ([0, 0], 2)])
    assert run_lru(requests, 4).hit_tokens == 6
    result = run_vllm(requests, 4)
    assert (result.hit_tokens, result.total_tokens, result.hit_blocks) == (4, 12, 1)
    assert result.evicted_pages == 0 and result.peak_pages == 2


def test_the_last_full_block_of_a_prompt_is_always_recomputed() -> None:
    # Prompt of exactly two full blocks, twice: vLLM can hit at most
    # floor((8 - 1) / 4) = 1 block; leaf LRU hits both.
    requests = chain_requests([([0, 0], 4), ([0, 0], 4)])
    assert run_lru(requests, 4).hit_tokens == 8
    result = run_vllm(requests, 4)
    assert (result.hit_tokens, result.hit_blocks) == (4, 1)
    # The recomputed block is a second cached copy: three pages cached, none evicted.
    assert result.peak_pages == 3 and result.evicted_pages == 0


def test_partial_blocks_take_no_cache_room_so_vllm_keeps_a_prefix_leaf_lru_drops() -> None:
    # Capacity 4.  A+a, then B+b, then C+c (full block + 2 tokens each), then A+a again.
    # Leaf LRU caches each partial block: A,a,B,b fill the pool, so C+c evicts a and
    # then A (the oldest leaves) and the fourth request misses.  vLLM returns each
    # partial page to the queue head, where the next request reuses it, so A, B and
    # C all stay cached and A hits.
    requests = chain_requests([([0, 0], 2), ([1, 0], 2), ([2, 0], 2), ([0, 0], 2)])
    lru = run_lru(requests, 4)
    assert lru.hit_tokens == 0 and lru.evicted_pages == 4  # the fourth request evicts b, B
    result = run_vllm(requests, 4)
    assert (result.hit_tokens, result.evicted_pages) == (4, 0)


def test_a_hit_revives_a_free_block_and_tails_are_evicted_first() -> None:
    # Capacity 4.  A B C (full, + 1 token) fill 4 pages; freed tail first, the
    # queue holds [p, C, B, A].  D E (+1) pops p, C, B: C and B are evicted, A stays,
    # and the queue becomes [p', A, E, D].  Then A B (+1) hits A only (4 tokens): the
    # free A is taken out of the queue, and the two new blocks pop p' and E (evicted).
    requests = chain_requests([([0, 0, 0, 0], 1), ([1, 0, 0], 1), ([0, 0, 0], 1)])
    result = run_vllm(requests, 4)
    assert (result.hit_tokens, result.hit_blocks, result.evicted_pages) == (4, 1, 3)


def test_a_prompt_larger_than_the_pool_is_rejected_and_output_blocks_are_cached() -> None:
    rejected = run_vllm(chain_requests([([0, 0, 0], 4)]), 2)
    assert rejected.rejected_requests == 1 and rejected.peak_pages == 0
    # Decode: prompt A + 2 tokens, 9 output tokens -> 8 computed output tokens fill the
    # partial block and two more; 3 full blocks cached (private keys), 1 partial.
    decoded = run_vllm(chain_requests([([0, 0], 2)], outputs=9), 8, decode=True)
    assert decoded.peak_pages == 4 and decoded.retracted_requests == 0
    retracted = run_vllm(chain_requests([([0, 0], 2)], outputs=9), 3, decode=True)
    assert retracted.retracted_requests == 1 and retracted.peak_pages == 2


def test_warmup_window_and_underfilled_flag() -> None:
    requests = chain_requests([([0], 4), ([1], 4), ([0, 0], 2), ([0, 0], 2)])
    warm = run_vllm(requests, 2, warmup=0.5)
    assert (warm.measured_requests, warm.hit_tokens, warm.total_tokens) == (2, 8, 12)
    assert not warm.underfilled
    roomy = run_vllm(requests, 50, warmup=0.5)
    assert roomy.underfilled


prompts = st.lists(
    st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=5), st.integers(1, BLOCK)),
    min_size=1,
    max_size=16,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=prompts, capacity=st.integers(2, 10), warmup=st.sampled_from([0.0, 0.5]))
def test_driver_matches_the_independent_free_queue_model(
    case: list[tuple[list[int], int]], capacity: int, warmup: float
) -> None:
    requests = chain_requests(case)
    model = FreeQueueModel(capacity)
    first = int(len(requests) * warmup)
    for index, request in enumerate(requests):
        model.run(request, measured=index >= first)
    result = run_vllm(requests, capacity, warmup)
    assert (result.hit_tokens, result.total_tokens, result.hit_blocks) == (
        model.hit_tokens,
        model.total_tokens,
        model.hit_blocks,
    )
    assert (result.evicted_pages, result.rejected_requests) == (model.evicted, model.rejected)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=prompts, capacity=st.integers(2, 10))
def test_driver_matches_the_reference_tools_free_queue(
    case: list[tuple[list[int], int]], capacity: int
) -> None:
    """tools/trace_hit_rates.vllm_free_queue (no kvstate import) is a third implementation."""
    requests = chain_requests(case)
    sim, trace = reference_trace(requests)
    expected = sim.vllm_free_queue(trace, capacity, block=BLOCK)
    result = run_vllm(requests, capacity)
    assert (result.hit_tokens, result.hit_blocks) == (expected.hit_tokens, expected.hit_blocks)
    assert result.evicted_pages == expected.evicted_blocks


def write_trace(path: Path) -> Path:
    lines = [
        {"timestamp": 0, "input_length": 1030, "output_length": 10, "hash_ids": [0, 1, 2]},
        {"timestamp": 1, "input_length": 1536, "output_length": 10, "hash_ids": [0, 1, 3]},
        {"timestamp": 2, "input_length": 700, "output_length": 10, "hash_ids": [4, 5]},
        {"timestamp": 3, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 6]},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def test_cli_sweep_with_lru_and_vllm_writes_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t.jsonl")
    out = tmp_path / "out"
    argv = ["simulate", str(trace), "--capacity", "3b,8b", "--policy", "lru,vllm", "--json"]
    argv += ["--out", str(out)]
    assert main(argv) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["policy"], r["capacity_pages"]) for r in records] == [
        ("lru", 3),
        ("lru", 8),
        ("vllm", 3),
        ("vllm", 8),
    ]
    roomy = records[3]
    # Request 2 hits blocks 0 and 1 (1024 tokens), request 4 too; block 2 of request 1
    # is partial (6 tokens) and never cached.
    assert (roomy["hit_tokens"], roomy["total_tokens"]) == (2048, 4366)
    assert {"results.csv", "results.json"} <= {p.name for p in out.iterdir()}
    saved = json.loads((out / "results.json").read_text())["results"]
    assert [r["policy"] for r in saved] == ["lru", "lru", "vllm", "vllm"]
    assert "free-queue" in saved[3]["definition"] and "free-queue" not in saved[0]["definition"]


@pytest.mark.parametrize("batching", [[], ["--max-running", "2"]])
def test_cli_record_writes_a_replayable_block_mode_log(tmp_path: Path, batching: list[str]) -> None:
    from kvstate.replay import replay_path

    trace = write_trace(tmp_path / "t.jsonl")
    log = tmp_path / "run.kvlog"
    argv = ["simulate", str(trace), "--capacity", "3b", "--policy", "vllm", "--warmup", "0.5", *batching]
    assert main([*argv, "--record", str(log)]) == 0
    replayed = replay_path(str(log))
    assert replayed.ok
    assert replayed.state.geometry.mode == "block" and replayed.state.geometry.num_pages == 3
    assert main(["replay", str(log)]) == 0


def test_vllm_needs_block_granularity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t.jsonl")
    base = ["simulate", str(trace), "--capacity", "3b", "--policy", "vllm"]
    assert main([*base, "--granularity", "token"]) == 2
    assert "block granularity" in capsys.readouterr().err


def timed(requests: list[TraceRequest], arrivals: list[float], outputs: list[int]) -> list[TraceRequest]:
    return [
        attrs.evolve(request, arrival_s=arrival, output_length=output)
        for request, arrival, output in zip(requests, arrivals, outputs, strict=True)
    ]


def run_batched(requests: list[TraceRequest], capacity: int, max_running: int, decode: bool = True):  # type: ignore[no-untyped-def]
    run = SimulationSettings(
        capacity_tokens=capacity * BLOCK, policy="vllm", decode=decode, max_running=max_running,
        step_ms=1000.0,
    )
    return simulate(requests, run, len(requests))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=prompts, capacity=st.integers(2, 10))
def test_batching_with_spaced_arrivals_equals_one_at_a_time(
    case: list[tuple[list[int], int]], capacity: int
) -> None:
    requests = timed(chain_requests(case), [10.0 * i for i in range(len(case))], [0] * len(case))
    batched = run_batched(requests, capacity, max_running=4, decode=False)
    alone = run_vllm(requests, capacity)
    assert (batched.hit_tokens, batched.evicted_pages, batched.rejected_requests) == (
        alone.hit_tokens,
        alone.evicted_pages,
        alone.rejected_requests,
    )


def test_a_running_request_shares_its_prompt_blocks_at_once() -> None:
    # r0 (A B + 1 token, 8 output tokens) is still decoding when r1 (A B + 2) arrives
    # one step later.  vLLM caches r0's full prompt blocks at prefill, so r1 hits
    # A and B (8 tokens); the radix planner caches r0's prefix only when r0 finishes.
    requests = timed(chain_requests([([0, 0, 0], 1), ([0, 0, 1], 2)]), [0.0, 1.0], [8, 1])
    vllm = run_batched(requests, 16, max_running=4)
    assert (vllm.hit_tokens, vllm.hit_blocks) == (8, 2)
    assert vllm.waited_requests == 0 and vllm.retracted_requests == 0
    lru = simulate(
        requests,
        SimulationSettings(capacity_tokens=16 * BLOCK, max_running=4, step_ms=1000.0),
        len(requests),
    )
    assert lru.hit_tokens == 0


def test_a_request_waits_for_blocks_a_running_request_holds() -> None:
    # Capacity 4: r0 holds 3 blocks while it decodes; r1 needs 2 and waits, then runs.
    requests = timed(chain_requests([([0, 0, 0], 1), ([1, 0], 2)]), [0.0, 1.0], [6, 1])
    result = run_batched(requests, 4, max_running=4)
    assert result.waited_requests == 1 and result.rejected_requests == 0
    assert result.peak_pages == 4


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=prompts,
    capacity=st.integers(3, 10),
    max_running=st.integers(1, 4),
    timing=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 12)), min_size=16, max_size=16),
)
def test_no_chain_position_loses_its_last_copy_while_a_descendant_stays_cached(
    case: list[tuple[list[int], int]], capacity: int, max_running: int, timing: list[tuple[int, int]]
) -> None:
    """Tails are freed first and hits touch every ancestor, so no gap forms, even batched."""
    from kvstate.events import BlockUncache
    from kvstate.simulate.batching import BatchingSimulator
    from kvstate.simulate.vllm_driver import VllmTraceSimulator

    requests = chain_requests(case)
    arrivals = sorted(float(arrival) for arrival, _ in timing[: len(requests)])
    requests = timed(requests, arrivals, [output for _, output in timing[: len(requests)]])
    run = SimulationSettings(
        capacity_tokens=capacity * BLOCK, policy="vllm", max_running=max_running, step_ms=1000.0
    )
    simulator = VllmTraceSimulator(run, BLOCK, "fixture")
    hollow: list[int] = []

    def watch(event: object, state: Any) -> None:
        if isinstance(event, BlockUncache):
            hollow.extend(n for n in event.nodes if n in state.nodes and not state.nodes[n].pages)

    simulator.engine.subscribe(watch)
    BatchingSimulator(simulator, max_running, 1000.0).run(requests, len(requests))
    assert hollow == []
