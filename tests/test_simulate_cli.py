"""``kvstate simulate`` as a user meets it: the shipped sample, traces without prefix data, units."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kvstate.cli import main
from kvstate.log import read_header
from kvstate.replay import replay_path
from kvstate.traces import read_trace
from kvstate.traces.sample import SAMPLE_FILES, SAMPLE_NAME, sample_trace

REPO = Path(__file__).resolve().parent.parent
SHARED_TRACE = REPO.parent / "shared" / "traces" / "conversation_trace.jsonl"
AZURE_ROWS = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
    f"2023-11-16 18:00:{second:02d}.0,{100 + second},{3 + second % 5}\n" for second in range(40)
)


def test_the_sample_trace_ships_inside_the_package_with_its_license() -> None:
    folder = REPO / "kvstate" / "traces" / "data"
    assert sorted(p.name for p in folder.iterdir()) == sorted(SAMPLE_FILES)
    readme = (folder / "README.md").read_text(encoding="utf-8")
    digest = hashlib.sha256((folder / SAMPLE_NAME).read_bytes()).hexdigest()
    assert digest in readme and "Apache License" in readme
    assert "Apache License" in (folder / "LICENSE-APACHE-2.0.txt").read_text(encoding="utf-8")
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert '"kvstate.traces" = ["data/*.jsonl", "data/*.txt", "data/*.md"]' in pyproject
    with sample_trace() as path:
        requests = list(read_trace(path, with_tokens=False))
    assert len(requests) == 1000 and all(r.block_keys[0] == 0 for r in requests)


@pytest.mark.skipif(not SHARED_TRACE.exists(), reason="shared traces absent")
def test_the_sample_is_the_unchanged_head_of_the_upstream_trace() -> None:
    with sample_trace() as path:
        sample = path.read_bytes()
    upstream = SHARED_TRACE.read_bytes()
    assert upstream.startswith(sample) and sample.count(b"\n") == 1000


def test_simulate_sample_runs_without_a_trace_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--sample", "--capacity", "1e12", "--json", "--no-progress"]) == 0
    record = json.loads(capsys.readouterr().out)
    # Every block of the 1,000 requests fits: the infinite-cache prefix hit rate of the slice.
    assert (record["requests"], record["evicted_blocks"]) == (1000, 0)
    assert record["hit_rate_tokens"] == pytest.approx(0.2157, abs=1e-4)


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--capacity", "1M"], "give a TRACE file or --sample"),
     (["x.jsonl", "--sample", "--capacity", "1M"], "give a TRACE file or --sample"),
     # Regression: an infinite capacity reached int() and crashed with OverflowError.
     (["--sample", "--capacity", "1e400"], "capacity '1e400' is too large"),
     (["--sample", "--capacity", "1M", "--block-size", "100000"], "--block-size in [1, 65536]")],
)
def test_usage_errors_of_the_trace_arguments(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["simulate", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_trace_without_prefix_data_is_named_up_front_and_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression: the Azure CSVs were simulated in full (78 s) to print a hit rate of 0.0000.
    trace = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    trace.write_text(AZURE_ROWS, encoding="utf-8")

    def no_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("a run started on a trace without prefix data")

    monkeypatch.setattr("kvstate.commands._simulate_run.simulate", no_run)
    assert main(["simulate", str(trace), "--capacity", "1M,2M"]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    note, skipped = captured.err.strip().splitlines()
    assert "has no prefix data (the Azure 2023 traces carry only arrival times and token counts)" in note
    assert "hit rate is 0 at any capacity" in note
    assert skipped.startswith("kvstate simulate: skipped 2 run(s)") and "--max-running" in skipped


def test_a_trace_without_prefix_data_still_runs_under_batching(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "az.csv"
    trace.write_text(AZURE_ROWS, encoding="utf-8")
    assert main(["simulate", str(trace), "--capacity", "2k", "--max-running", "4", "--json"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    assert record["hit_rate_tokens"] == 0.0 and record["max_running"] == 4
    assert "has no prefix data" in captured.err


def test_record_in_block_granularity_says_a_page_is_a_trace_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Regression: the log read as "N pages x 1 tokens" with nothing saying a page was 512 tokens.
    log = tmp_path / "run.kvlog"
    argv = ["simulate", "--sample", "--limit", "30", "--capacity", "200b", "--record", str(log)]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert "(200 blocks of 512 tokens)" in out[0] and "peak 200 blocks" in out[0]
    assert out[1].startswith(f"recorded {log}: one slot of the log is one trace block of 512 tokens")
    meta = read_header(str(log)).meta
    assert (meta["granularity"], meta["tokens_per_slot"]) == ("block", 512)
    result = replay_path(str(log))
    assert result.ok and result.summary.granularity == "slot of 512 tokens"
    assert result.summary.prompt_tokens % 512 == 0  # replay counts tokens, not blocks


def test_record_in_token_granularity_keeps_token_slots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "tokens.kvlog"
    argv = ["simulate", "--sample", "--limit", "3", "--capacity", "1M", "--granularity", "token",
            "--page-size", "32", "--record", str(log), "--json"]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["record"] == {"log": str(log), "page_size": 32, "tokens_per_slot": 1}
    assert read_header(str(log)).meta["tokens_per_slot"] == 1
