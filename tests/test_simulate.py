"""``kvstate simulate``: the planner-driven simulator against the independent reference in tools/."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstate.cli import main
from kvstate.planner.policy import LeafLFU, PolicyError, load_policy
from kvstate.simulate import SimulationSettings, simulate
from kvstate.traces import TraceRequest
from tests.trace_fixtures import BLOCK, chain_requests, reference_trace


def requests_from(paths: list[list[int]], tails: list[int], outputs: int = 0) -> list[TraceRequest]:
    """Prefix-chained block keys (a trie path -> keys); the last block holds ``tail`` tokens."""
    return chain_requests(list(zip(paths, tails, strict=True)), outputs)


trie_paths = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=5), min_size=1, max_size=14).flatmap(
    lambda paths: st.tuples(
        st.just(paths), st.lists(st.integers(1, BLOCK), min_size=len(paths), max_size=len(paths))
    )
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=trie_paths, capacity=st.integers(5, 12), warmup=st.sampled_from([0.0, 0.5]))
def test_per_page_lru_matches_the_reference_trie_lru(
    case: tuple[list[list[int]], list[int]], capacity: int, warmup: float
) -> None:
    """Same semantics as tools/trace_hit_rates.leaf_lru (and kvcache-simulator): exact hit tokens."""
    paths, tails = case
    requests = requests_from(paths, tails)
    sim, trace = reference_trace(requests)
    expected = sim.leaf_lru(trace, capacity, warmup)
    run = SimulationSettings(
        capacity_tokens=capacity * BLOCK, warmup=warmup, eviction_unit="page", decode=False
    )
    result = simulate(requests, run, len(requests))
    assert result.rejected_requests == 0  # every request fits (at most 5 blocks)
    assert (result.hit_tokens, result.total_tokens) == (expected.hit_tokens, expected.total_tokens)
    assert result.hit_blocks == expected.hit_blocks
    assert result.evicted_pages == expected.evicted_blocks


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=trie_paths, capacity=st.integers(2, 4))
def test_a_prompt_larger_than_the_pool_is_refused_as_the_reference_rejects_it(
    case: tuple[list[list[int]], list[int]], capacity: int
) -> None:
    """Pools smaller than some prompts: kvstate refuses them whole (nothing cached), which is
    the reference's ``reject_larger``; plain ``leaf_lru`` (and kvcache-simulator) would cache
    the prefix that fits instead."""
    paths, tails = case
    requests = requests_from(paths, tails)
    sim, trace = reference_trace(requests)
    expected = sim.leaf_lru(trace, capacity, reject_larger=True)
    run = SimulationSettings(capacity_tokens=capacity * BLOCK, eviction_unit="page", decode=False)
    result = simulate(requests, run, len(requests))
    assert (result.hit_tokens, result.hit_blocks) == (expected.hit_tokens, expected.hit_blocks)
    assert result.evicted_pages == expected.evicted_blocks
    assert result.rejected_requests == sum(1 for path in paths if len(path) > capacity)


@settings(max_examples=20, deadline=None)
@given(case=trie_paths)
def test_roomy_cache_equals_the_infinite_reference(case: tuple[list[list[int]], list[int]]) -> None:
    paths, tails = case
    requests = requests_from(paths, tails, outputs=3)
    sim, trace = reference_trace(requests)
    expected = sim.infinite(trace)
    result = simulate(requests, SimulationSettings(capacity_tokens=10_000), len(requests))
    assert (result.hit_tokens, result.total_tokens) == (expected.hit_tokens, expected.total_tokens)
    assert result.evicted_pages == 0


def test_hand_computed_node_eviction_and_counters() -> None:
    # Capacity 2 blocks, SGLang node eviction.  A=[1,4] B=[1,5] C=[1,4] (keys of full blocks).
    requests = requests_from([[0, 0], [0, 1], [0, 0]], [BLOCK, BLOCK, BLOCK])
    result = simulate(requests, SimulationSettings(capacity_tokens=2 * BLOCK, decode=False), 3)
    # A misses and fills the pool.  B hits block 1 (the match splits A's node), locks it and
    # evicts leaf 4 to place 5.  C hits block 1 only and evicts leaf 5 to place 4 again.
    assert (result.hit_tokens, result.total_tokens) == (8, 24)
    assert (result.hit_blocks, result.total_blocks) == (2, 6)
    assert result.evicted_pages == 2
    assert result.peak_pages == 2
    assert result.underfilled is False
    assert result.to_json()["hit_rate_tokens"] == pytest.approx(1 / 3)


def test_a_request_larger_than_the_pool_is_rejected_and_output_needs_room() -> None:
    requests = requests_from([[0, 0, 0, 0, 0], [0]], [BLOCK, BLOCK], outputs=BLOCK * 2)
    result = simulate(requests, SimulationSettings(capacity_tokens=4 * BLOCK), 2)
    assert result.rejected_requests == 1  # 5 blocks never fit in 4
    assert result.retracted_requests == 0  # the second: 1 prompt block + 2 output blocks fit
    assert result.peak_pages == 3


def test_warmup_window_and_underfilled_flag() -> None:
    requests = requests_from([[0], [0], [0], [0]], [BLOCK] * 4)
    result = simulate(requests, SimulationSettings(capacity_tokens=100 * BLOCK, warmup=0.5), 4)
    assert (result.measured_requests, result.hit_tokens, result.total_tokens) == (2, 8, 8)
    assert result.underfilled is True
    assert "floor(0.5 * n)" in result.definition


def test_lfu_keeps_the_popular_path_that_lru_drops() -> None:
    policy = load_policy("lfu")
    assert isinstance(policy, LeafLFU)
    # A A A B C A with room for two 2-block paths.  At C, LRU drops A (used before B);
    # LFU drops B (used once), so the final A hits only under LFU.
    requests = requests_from([[0, 0], [0, 0], [0, 0], [1, 0], [2, 0], [0, 0]], [BLOCK] * 6)
    lfu = simulate(requests, SimulationSettings(capacity_tokens=4 * BLOCK, policy="lfu"), 6)
    lru = simulate(requests, SimulationSettings(capacity_tokens=4 * BLOCK), 6)
    assert (lru.hit_tokens, lfu.hit_tokens) == (16, 24)


def test_policy_loading_errors() -> None:
    assert load_policy("kvstate.planner.policy:LeafFIFO") is not None
    with pytest.raises(PolicyError, match="unknown policy"):
        load_policy("mru")
    with pytest.raises(PolicyError, match="cannot import"):
        load_policy("no_such_module_xyz:Policy")
    with pytest.raises(PolicyError, match="has no"):
        load_policy("kvstate.planner.policy:Nope")


# --- the command ----------------------------------------------------------------------------


def write_trace(path: Path) -> Path:
    lines = []
    for index, ids in enumerate([[0, 1, 2], [0, 1, 3], [0, 4], [0, 1, 2], [0, 1, 5]]):
        lines.append(
            json.dumps({"timestamp": index, "input_length": 1024 + 100, "output_length": 7, "hash_ids": ids})
            if len(ids) == 3
            else json.dumps({"timestamp": index, "input_length": 600, "output_length": 7, "hash_ids": ids})
        )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_cli_json_out_and_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t.jsonl")
    out = tmp_path / "out"
    code = main(
        ["simulate", str(trace), "--capacity", "100k,6b", "--policy", "lru,fifo", "--json", "--out", str(out)]
    )
    assert code == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(records) == 4
    for key in ("capacity_tokens", "policy", "hit_rate_tokens", "hit_rate_blocks", "evicted_blocks"):
        assert all(key in record for record in records)
    assert [(r["policy"], r["capacity_tokens"]) for r in records] == [
        ("lru", 100_000),
        ("lru", 3072),
        ("fifo", 100_000),
        ("fifo", 3072),
    ]
    roomy = records[0]
    # Roomy: request 2 shares blocks 0,1 with request 1 (1024 tokens), request 3 block 0 (512),
    # request 4 repeats request 1 (1124), request 5 shares blocks 0,1 (1024).
    # Total 4 * 1124 + 600 = 5096.
    assert (roomy["requests"], roomy["warmup"]) == (5, 0.0)
    assert roomy["hit_rate_tokens"] == pytest.approx((1024 + 512 + 1124 + 1024) / 5096)
    assert sorted(p.name for p in out.iterdir()) == ["hit_rate.png", "results.csv", "results.json"]
    with (out / "results.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 4 and all("window:" in row["definition"] for row in rows)
    assert json.loads((out / "results.json").read_text())["results"][1]["capacity_pages"] == 6


def test_cli_record_writes_a_replayable_log(tmp_path: Path) -> None:
    from kvstate.replay import replay_path

    trace = write_trace(tmp_path / "t.jsonl")
    log = tmp_path / "run.kvlog"
    assert main(["simulate", str(trace), "--capacity", "4b", "--record", str(log)]) == 0
    replayed = replay_path(str(log))
    assert replayed.ok
    assert replayed.state.geometry.num_pages == 4


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--capacity", "lots"], "bad capacity"),
        (["--capacity", "1M", "--policy", "mru"], "unknown policy"),
        (["--capacity", "1M", "--warmup", "1.5"], "--warmup"),
        (["--capacity", "1M,2M", "--record", "x.log"], "exactly one capacity"),
        (["--capacity", "10"], "less than one page"),
    ],
)
def test_cli_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    trace = write_trace(tmp_path / "t.jsonl")
    assert main(["simulate", str(trace), *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_malformed_trace_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}\nnope\n')
    assert main(["simulate", str(trace), "--capacity", "1M"]) == 1
    assert "bad.jsonl:2: invalid JSON" in capsys.readouterr().err


def test_huge_capacity_builds_a_bounded_pool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t.jsonl")
    assert main(["simulate", str(trace), "--capacity", "100k,1e15", "--json"]) == 0
    roomy, huge = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert huge["capacity_pages"] == 10**15 // 512
    assert huge["hit_tokens"] == roomy["hit_tokens"] and huge["evicted_blocks"] == 0


def test_block_granularity_needs_hashes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "az.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.0,40,3\n")
    assert main(["simulate", str(trace), "--capacity", "1k", "--granularity", "block"]) == 2
    assert "no hash blocks" in capsys.readouterr().err
    assert main(["simulate", str(trace), "--capacity", "1k", "--json", "--force"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert (record["granularity"], record["block_size"], record["hit_rate_tokens"]) == ("token", 16, 0.0)


# --- continuous batching (--max-running) ------------------------------------------------------


def at_time_zero(requests: list[TraceRequest]) -> list[TraceRequest]:
    return [attrs.evolve(request, arrival_s=0.0) for request in requests]


def test_batching_with_spaced_arrivals_equals_one_at_a_time() -> None:
    requests = requests_from([[0, 0], [0, 0], [0, 0], [1, 0], [2, 0], [0, 0]], [BLOCK] * 6, outputs=3)
    alone = simulate(requests, SimulationSettings(capacity_tokens=4 * BLOCK), 6)
    batched = simulate(requests, SimulationSettings(capacity_tokens=4 * BLOCK, max_running=4), 6)
    assert (alone.hit_tokens, batched.hit_tokens) == (16, 16)
    assert batched.waited_requests == 0 and batched.requests == 6
    assert "max_running 4" in batched.definition


def test_overlapping_requests_miss_the_prefix_a_running_request_has_not_cached_yet() -> None:
    requests = at_time_zero(requests_from([[0], [0]], [BLOCK, BLOCK], outputs=4))
    roomy = 100 * BLOCK
    together = simulate(requests, SimulationSettings(capacity_tokens=roomy, max_running=2), 2)
    one_slot = simulate(requests, SimulationSettings(capacity_tokens=roomy, max_running=1), 2)
    assert together.hit_tokens == 0  # both admitted in the same iteration
    assert one_slot.hit_tokens == BLOCK  # the second waits for a running slot, then hits
    assert one_slot.waited_requests == 0  # waiting for a slot is not waiting for room


def test_a_request_waits_for_room_then_hits_what_the_first_cached() -> None:
    # 3 pages.  A = [1,2] + 4 output tokens needs 3 pages; B = [1,3] arrives together and
    # cannot get 2 pages while A runs, so it waits, then reuses A's cached block 1.
    requests = at_time_zero(requests_from([[0, 0], [0, 1]], [BLOCK, BLOCK], outputs=4))
    result = simulate(requests, SimulationSettings(capacity_tokens=3 * BLOCK, max_running=2), 2)
    assert (result.waited_requests, result.retracted_requests, result.rejected_requests) == (1, 0, 0)
    assert (result.hit_tokens, result.total_tokens) == (BLOCK, 4 * BLOCK)
    assert result.peak_pages == 3


def test_decode_that_cannot_get_a_page_retracts() -> None:
    # 2 pages; A and B (different prompts) are admitted together, one page each; A's first
    # output token needs a second page and nothing is evictable, so A is retracted.
    requests = at_time_zero(requests_from([[0], [1]], [BLOCK, BLOCK], outputs=2))
    result = simulate(requests, SimulationSettings(capacity_tokens=2 * BLOCK, max_running=2), 2)
    assert result.retracted_requests == 1
    assert result.rejected_requests == 0 and result.requests == 2


def test_cli_max_running_reports_waits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t.jsonl")
    assert main(["simulate", str(trace), "--capacity", "100k", "--max-running", "3", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert (record["max_running"], record["step_ms"], record["waited_requests"]) == (3, 20.0, 0)
    assert main(["simulate", str(trace), "--capacity", "100k", "--max-running", "0"]) == 2
    assert "max_running" in capsys.readouterr().err
