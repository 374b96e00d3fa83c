"""``kvstate simulate --model``: layout arithmetic by hand, custom layouts and their errors, runs."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from kvstate.cli import main
from kvstate.commands.simulate import parse_memory
from kvstate.simulate.driver import simulate
from kvstate.simulate.hybrid_pools import need_batch, sglang_batch, size_pools
from kvstate.simulate.layout_parse import LayoutError, parse_model
from kvstate.simulate.models import NAMED, HybridLayout, mamba2_state_bytes
from kvstate.simulate.settings import SimulationSettings
from kvstate.traces import read_trace
from kvstate.traces.sample import sample_trace

GIB = 1 << 30
SGLANG = {"swa_ratio": Fraction("0.8"), "mamba_ratio": Fraction("0.9")}


def test_gpt_oss_20b_bytes_pools_and_batches_by_hand() -> None:
    layout = NAMED["gpt-oss-20b"]
    # one layer: 8 KV heads x (64 K + 64 V) x 2 bytes
    assert layout.layer_bytes_per_token == 8 * 128 * 2 == 2048
    assert layout.fa_bytes_per_token == 24 * 2048 == 49_152
    assert (layout.full_bytes_per_token, layout.swa_bytes_per_token) == (24_576, 24_576)
    pools = size_pools(layout, 40 * GIB, **SGLANG)
    assert pools.fa_tokens == 42_949_672_960 // 49_152 == 873_813
    # SGLang: cell = 24,576 + 0.8 * 24,576 = 44,236.8 bytes per full-pool token
    assert pools.full_tokens == 970_903 and pools.swa_tokens == 776_722  # int(970,903 * 0.8)
    assert (pools.mamba_slots, pools.max_running) == (0, None)
    # 8,704 tokens: full 970,903 // 8,704 = 111; SWA 776,722 // (128 + 128 + 2) = 3,010
    assert sglang_batch(layout, pools, 8_704) == 111
    # per-request need: 8,704 * 24,576 + 128 * 24,576 = 217,055,232 bytes
    assert need_batch(layout, 40 * GIB, 8_704) == 42_949_672_960 // 217_055_232 == 197


def test_qwen3_next_state_and_mamba_pool_by_hand() -> None:
    layout = NAMED["qwen3-next-80b-a3b"]
    conv = (32 * 128 + 2 * 16 * 128) * (4 - 1) * 2  # (value dim + 2 * key dim) x 3, bf16
    ssm = 32 * 128 * 128 * 4  # value heads x value head dim x key head dim, fp32
    assert layout.state_bytes_per_layer == conv + ssm == 2_146_304
    assert layout.state_bytes == 36 * 2_146_304 == 77_266_944
    assert (layout.fa_bytes_per_token, layout.full_bytes_per_token) == (48 * 2048, 12 * 2048)
    pools = size_pools(layout, 40 * GIB, **SGLANG)
    budget = Fraction(40 * GIB) * Fraction(9, 19)  # 0.9 / 1.9 of the memory goes to states
    assert pools.mamba_slots == int((budget - 77_266_944) // 77_266_944) == 262
    assert pools.mamba_bytes == 263 * 77_266_944  # one padding slot
    assert pools.full_tokens == (40 * GIB - 263 * 77_266_944) // 24_576
    assert pools.max_running == 262 // 5 and sglang_batch(layout, pools, 1000) == 52
    assert NAMED["nemotron-h-8b"].state_bytes_per_layer == mamba2_state_bytes(
        intermediate=8192, groups=8, heads=128, head_dim=64, state_size=128, conv_kernel=4)


# name: (layers full / swa / mamba, bytes of K + V per token per attention layer, state bytes)
# one layer's K + V = kv_heads x head_dim x 2 x 2 bytes (bf16), from each config.json
HAND = {
    "gpt-oss-20b": ((12, 12, 0), 8 * 64 * 2 * 2, 0),  # 2,048
    "gemma-3-27b": ((10, 52, 0), 16 * 128 * 2 * 2, 0),  # 8,192; 62 layers, 5 local : 1 global
    "llama-4-scout": ((12, 36, 0), 8 * 128 * 2 * 2, 0),  # 4,096; every 4th layer global
    "qwen3-next-80b-a3b": ((12, 0, 36), 2 * 256 * 2 * 2, 36 * 2_146_304),  # 2,048
    # Nemotron-H: conv (8,192 + 2 x 8 x 128) x 3 x 2 B = 61,440; SSM 128 x 64 x 128 x 4 B
    "nemotron-h-8b": ((4, 0, 24), 8 * 128 * 2 * 2, 24 * (61_440 + 4_194_304)),  # 4,096
}


@pytest.mark.parametrize("name", sorted(HAND))
def test_bytes_per_token_of_every_named_layout_by_hand(name: str) -> None:
    (full, swa, mamba), layer, state = HAND[name]
    layout = NAMED[name]
    assert (layout.full_layers, layout.swa_layers, layout.mamba_layers) == (full, swa, mamba)
    assert layout.layer_bytes_per_token == layer
    assert layout.fa_bytes_per_token == (full + swa + mamba) * layer
    assert layout.full_bytes_per_token == full * layer
    assert layout.swa_bytes_per_token == swa * layer
    assert layout.state_bytes == state
    assert layout.source.startswith("huggingface.co/")


def test_written_out_bytes_per_token() -> None:
    """The same figures as the docs print them (docs/results.md, section 7)."""
    assert {name: (NAMED[name].fa_bytes_per_token, NAMED[name].full_bytes_per_token,
                   NAMED[name].swa_bytes_per_token, NAMED[name].state_bytes) for name in HAND} == {
        "gpt-oss-20b": (49_152, 24_576, 24_576, 0),
        "gemma-3-27b": (507_904, 81_920, 425_984, 0),
        "llama-4-scout": (196_608, 49_152, 147_456, 0),
        "qwen3-next-80b-a3b": (98_304, 24_576, 0, 77_266_944),
        "nemotron-h-8b": (114_688, 16_384, 0, 102_137_856),
    }


def test_largest_batch_of_sliding_window_layouts_by_hand() -> None:
    memory = 40 * GIB
    gemma = NAMED["gemma-3-27b"]
    pools = size_pools(gemma, memory, **SGLANG)
    assert pools.fa_tokens == memory // 507_904 == 84_562
    # cell = 81,920 + 0.8 x 425,984 = 422,707.2 B: full = 5 x memory // (5 x 81,920 + 4 x 425,984)
    assert pools.full_tokens == 5 * memory // (5 * 81_920 + 4 * 425_984) == 101_606
    assert pools.swa_tokens == 101_606 * 4 // 5 == 81_284
    # 9,193 tokens: full 101,606 // 9,193 = 11; SWA 81,284 // (1,024 + 130) = 70
    assert sglang_batch(gemma, pools, 9_193) == 11
    assert need_batch(gemma, memory, 9_193) == memory // (9_193 * 81_920 + 1_024 * 425_984) == 36
    scout = NAMED["llama-4-scout"]
    pools = size_pools(scout, memory, **SGLANG)
    assert pools.full_tokens == 5 * memory // (5 * 49_152 + 4 * 147_456) == 257_003
    # the SWA pool binds: 205,602 // min(9,193, 8,192 + 130) = 24 (full alone would allow 27)
    assert pools.swa_tokens == 205_602 and sglang_batch(scout, pools, 9_193) == 24
    assert pools.full_tokens // 9_193 == 27
    # a Mamba layout is capped by its slots: 198 // 5 running for Nemotron-H
    nemotron = size_pools(NAMED["nemotron-h-8b"], memory, **SGLANG)
    assert nemotron.max_running == nemotron.mamba_slots // 5 == 39
    assert sglang_batch(NAMED["nemotron-h-8b"], nemotron, 27_346) == 39


def test_custom_layouts_parse() -> None:
    layout = parse_model("custom:full=8,swa=40,window=1024,kv_heads=8,head_dim=128")
    assert (layout.full_layers, layout.swa_layers, layout.window, layout.dtype_bytes) == (8, 40, 1024, 2)
    mamba = parse_model("custom:full=4, mamba=24, state_bytes=4255744, kv_heads=8, head_dim=128, "
                        "mamba_chunk=128, dtype_bytes=1")
    assert (mamba.state_bytes, mamba.mamba_chunk, mamba.layer_bytes_per_token) == (
        24 * 4_255_744, 128, 8 * 256)
    assert parse_model("gpt-oss-20b") is NAMED["gpt-oss-20b"]


@pytest.mark.parametrize(("text", "message"), [
    ("gpt-5", "unknown model 'gpt-5'"),
    ("custom:", "custom: needs key=value pairs"),
    ("custom:full=8,kv_heads=8", "head_dim is required"),
    ("custom:full=8,kv_heads=8,head_dim=64,layers=3", "unknown key 'layers'"),
    ("custom:full=8,full=9,kv_heads=8,head_dim=64", "full given twice"),
    ("custom:full=8,kv_heads=8,head_dim=64,swa=4", "swa needs window"),
    ("custom:full=8,kv_heads=8,head_dim=64,window=128", "window needs swa"),
    ("custom:full=8,kv_heads=8,head_dim=64,mamba=4", "mamba needs state_bytes"),
    ("custom:full=0,kv_heads=8,head_dim=64", "full must be in [1, 4096], got 0"),
    ("custom:full=8,kv_heads=eight,head_dim=64", "kv_heads must be a decimal integer"),
    ("custom:full=8,kv_heads=8,head_dim", "'head_dim' is not key=value"),
    ("custom:full=8,kv_heads=8,head_dim=64,dtype_bytes=3", "dtype_bytes must be 1, 2 or 4"),
])
def test_bad_custom_layouts_are_named(text: str, message: str) -> None:
    with pytest.raises(LayoutError, match=message.replace("[", r"\[").replace("(", r"\(")):
        parse_model(text)


def test_json_layouts(tmp_path: Path) -> None:
    good = tmp_path / "mine.json"
    good.write_text(json.dumps({"full": 6, "swa": 18, "window": 512, "kv_heads": 4, "head_dim": 64}))
    assert parse_model(str(good)) == HybridLayout("mine", full_layers=6, swa_layers=18, window=512,
                                                  kv_heads=4, head_dim=64, source=str(good))
    for body, message in (("[1]", "must be a JSON object"), ("{", "not JSON"),
                          ('{"full": 1.5, "kv_heads": 1, "head_dim": 1}', "full must be an integer"),
                          ('{"full": true, "kv_heads": 1, "head_dim": 1}', "full must be an integer")):
        bad = tmp_path / "bad.json"
        bad.write_text(body)
        with pytest.raises(LayoutError, match=message):
            parse_model(str(bad))
    with pytest.raises(LayoutError, match="cannot read"):
        parse_model(str(tmp_path / "absent.json"))


def test_memory_sizes() -> None:
    assert parse_memory("40GiB") == 40 * GIB and parse_memory("80GB") == 80 * 10**9
    assert parse_memory("1.5Gi") == 3 * GIB // 2 and parse_memory("1e10") == 10**10
    for text in ("40 gigs", "-1G", "1e400"):
        with pytest.raises(ValueError):
            parse_memory(text)


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "nope", "--memory", "1GiB"], "unknown model 'nope'"),
    (["--model", "custom:full=2", "--memory", "1GiB"], "custom: kv_heads is required"),
    (["--memory", "1GiB"], "--memory needs --model"),
    (["--model", "gpt-oss-20b"], "give --memory or --capacity"),
    (["--model", "gpt-oss-20b", "--memory", "1GiB", "--capacity", "1M"], "give --memory or --capacity"),
    (["--model", "gpt-oss-20b", "--memory", "1GiB", "--policy", "fifo"], "evicts by LRU only"),
    (["--model", "gpt-oss-20b", "--memory", "1GiB", "--max-running", "4"], "--max-running does not"),
    (["--model", "gpt-oss-20b", "--memory", "lots"], "bad memory 'lots'"),
    (["--model", "gpt-oss-20b", "--memory", "1GiB", "--swa-full-tokens-ratio", "2"], "must be in (0, 1]"),
    (["--model", "gpt-oss-20b", "--memory", "1e30"], "more than 1 EiB"),
    (["--model", "gpt-oss-20b", "--memory", "0"], "must be at least 1 byte"),
    (["--model", "gpt-oss-20b", "--memory", "-5GiB"], "bad memory '-5GiB'"),
    (["--model", "gpt-oss-20b", "--memory", "1" + "0" * 400], "more than 1 EiB"),
    (["--model", "gpt-oss-20b", "--capacity", "1e300"], "more than 1 EiB"),
    (["--model", "gpt-oss-20b", "--memory", "1GiB", "--mamba-full-memory-ratio", "1e100000000"],
     "must be a decimal number"),
    (["--model", "gpt-oss-20b", "--memory", "1GiB", "--mamba-full-memory-ratio", "101"],
     "must be in (0, 100]"),
    (["--model", "gpt-oss-20b", "--memory", "1GiB", "--swa-full-tokens-ratio", "nan"],
     "must be a decimal number"),
    (["--model", "gpt-oss-20b", "--memory", "1GiB", "--limit", "0"], "--limit must be at least 1"),
    (["--model", "custom:full=99999999999999999999,kv_heads=1,head_dim=1", "--memory", "1GiB"],
     "full must be in [1, 4096]"),
    (["--model", "custom:full=1,kv_heads=1,head_dim=1,,", "--memory", "1GiB"], "is not key=value"),
    (["--model", "custom:full=1,kv_heads=1,head_dim=1,swa=9,window=99999999", "--memory", "1GiB"],
     "window must be in"),
])
def test_bad_model_arguments_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                   message: str) -> None:
    assert main(["simulate", "--sample", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def _records(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[dict]:
    assert main(["simulate", "--sample", "--no-progress", "--json", *argv]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_a_small_sample_run_has_the_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    records = _records(capsys, ["--limit", "30", "--model", "gpt-oss-20b", "--model",
                                "qwen3-next-80b-a3b", "--memory", "4GiB,1e12"])
    assert [(r["model"]["name"], r["memory_bytes"]) for r in records] == [
        ("gpt-oss-20b", 4 * GIB), ("gpt-oss-20b", 10**12),
        ("qwen3-next-80b-a3b", 4 * GIB), ("qwen3-next-80b-a3b", 10**12)]
    for record in records:
        assert set(record) >= {"trace", "requests", "model", "kv_bytes_per_token", "pools", "batch",
                               "hit_rate", "runs", "definition", "not_run"}
        rates = record["hit_rate"]
        assert set(rates) == {"full_attention", "hybrid_full_rule", "hybrid", "hybrid_full_reach"}
        assert all(0 <= rate <= 1 for rate in rates.values())
        # the hybrid rule only ever shortens what the full layers could reuse
        assert rates["hybrid"] <= rates["hybrid_full_reach"] + 1e-12
        assert [b["which"] for b in record["batch"]] == ["median", "p90"]
        assert record["runs"]["hybrid"]["requests"] == 30
    small, large = records[0], records[1]
    # 4 GiB of gpt-oss holds fewer tokens than the 30 prompts; 1e12 bytes holds them all
    assert small["runs"]["full_attention"]["evicted_blocks"] > 0
    assert large["runs"]["full_attention"]["evicted_blocks"] == 0
    assert small["hit_rate"]["full_attention"] <= large["hit_rate"]["full_attention"]
    assert large["hit_rate"]["full_attention"] == large["hit_rate"]["hybrid_full_rule"]


def test_the_full_attention_rule_matches_the_lru_planner_in_64_token_pages(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The front end with no window binding is the planner's LRU with outputs cached."""
    record = _records(capsys, ["--limit", "60", "--model", "gpt-oss-20b", "--capacity", "200k"])[0]
    with sample_trace() as path:
        settings = SimulationSettings(capacity_tokens=200_000, granularity="token", page_size=64,
                                      cache_output=True)
        reference = simulate(read_trace(path, limit=60, with_tokens=False), settings, 60)
    assert record["pools"]["fa_tokens"] == 200_000
    assert record["hit_rate"]["full_attention"] == pytest.approx(reference.hit_rate_tokens, abs=0.005)


def test_a_pool_too_small_for_a_window_is_reported_not_run(capsys: pytest.CaptureFixture[str]) -> None:
    records = _records(capsys, ["--limit", "5", "--model", "custom:full=1,swa=60,window=8192,kv_heads=8,"
                                "head_dim=128", "--memory", "1GiB"])
    assert records[0]["hit_rate"]["hybrid"] is None
    assert "cannot hold one window" in records[0]["not_run"]["hybrid"]
    assert main(["simulate", "--sample", "--no-progress", "--limit", "5", "--model", "nemotron-h-8b",
                 "--memory", "8GiB"]) == 0
    text = capsys.readouterr().out
    assert "nemotron-h-8b: 4 full + 24 Mamba" in text and "largest batch" in text


def test_hostile_json_layouts_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 30_000 + "]" * 30_000)
    big = tmp_path / "big.json"
    big.write_text(" " * (1 << 17))
    for path, message in ((deep, "nested too deeply"), (big, "larger than 65536 bytes")):
        assert main(["simulate", "--sample", "--no-progress", "--model", str(path), "--memory",
                     "1GiB"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1


def test_a_huge_budget_builds_pools_no_larger_than_the_trace() -> None:
    """1e18 bytes of Qwen3-Next is 6 billion Mamba slots; the run builds a few per unit."""
    from kvstate.simulate.hybrid_driver import SglangHybridSimulator
    from kvstate.simulate.hybrid_report import ModelOptions, hybrid_plan, trace_shape

    with sample_trace() as path:
        shape = trace_shape(read_trace(path, limit=5, with_tokens=False))
    layout = NAMED["qwen3-next-80b-a3b"]
    pools = size_pools(layout, 10**18, **SGLANG)
    assert pools.mamba_slots > 6 * 10**9
    plan = hybrid_plan(layout, pools, shape)
    options = ModelOptions(**SGLANG)
    settings = SimulationSettings(capacity_tokens=plan.full_units * shape.unit, granularity="token",
                                  page_size=shape.unit, cache_output=True, decode=options.decode)
    simulator = SglangHybridSimulator(settings, shape.unit, shape.name, shape.unit_bound, plan)
    assert simulator.pool_pages == shape.unit_bound
    assert simulator.engine.view.mamba.num_slots <= shape.unit_bound + 10


def test_the_readme_example_runs_200_sample_requests(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--sample", "--limit", "200", "--no-progress", "--model", "gpt-oss-20b",
                 "--model", "custom:full=8,swa=40,window=1024,kv_heads=8,head_dim=128",
                 "--memory", "40GiB"]) == 0
    out = capsys.readouterr().out
    assert "gpt-oss-20b: 12 full + 12 sliding-window (128 tokens) layers" in out
    assert "full-attention equivalent 49,152 | hybrid 24,576 per cached token" in out
    assert "custom: 8 full + 40 sliding-window (1024 tokens) layers" in out
    # custom: 48 x 8 x 128 x 4 B = 196,608 as full attention; 8 x 4,096 = 32,768 per cached token
    assert "full-attention equivalent 196,608 | hybrid 32,768 per cached token" in out
    assert out.count("hit rate         as full attention 0.") == 2
