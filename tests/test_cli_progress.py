"""Progress reports and slow-setting warnings of the long commands (check, simulate, replay, minimize)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from kvstate.cli import main
from kvstate.commands import _advice
from kvstate.commands._progress import Progress, progress_mode
from kvstate.simulate.scan import TraceScan

REPO = Path(__file__).resolve().parent.parent
SEED_001 = str(REPO / "replay" / "seed" / "001_prefix_hit_walkthrough.kvlog")
DOUBLE_FREE = str(REPO / "replay" / "failing" / "double_free.kvlog")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_mode_follows_the_flag_and_the_terminal() -> None:
    pipe, terminal = io.StringIO(), _Terminal()
    assert progress_mode(None, pipe) == "off" and progress_mode(True, pipe) == "lines"
    assert progress_mode(None, terminal) == "bar" and progress_mode(True, terminal) == "bar"
    assert progress_mode(False, terminal) == "off"


def test_plain_lines_carry_count_rate_and_eta() -> None:
    out = io.StringIO()
    with Progress("job", total=200, unit="req", mode="lines", stream=out, line_interval_s=0) as bar:
        bar.update(50, "depth 3")
        bar._last_draw = 0.0  # updates closer than the draw interval only store the count
        bar.update(100, "depth 4")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("job:  50% 100/200 req [") and lines[0].endswith(", depth 4]")
    assert "req/s" in lines[0] and "<" in lines[0]  # rate and remaining time
    assert lines[-1].startswith("job:  50% 100/200 req")  # the last line, written at close


def test_unknown_total_shows_count_and_rate_without_eta() -> None:
    out = io.StringIO()
    Progress("scan", total=None, unit="states", mode="lines", stream=out).close()
    assert out.getvalue().startswith("scan: 0 states [00:00, ")


def test_the_bar_draws_on_a_terminal_and_erases_itself() -> None:
    out = _Terminal()
    bar = Progress("job", total=10, unit="req", mode="bar", stream=out)
    bar._last_draw = 0.0
    bar._bar.mininterval = 0  # tqdm's own throttle: draw now
    bar.update(5)
    bar.close()
    assert "5/10" in out.getvalue()
    assert out.getvalue().endswith("\r") or "\x1b" in out.getvalue()  # tqdm clears the line


def test_off_writes_nothing() -> None:
    out = io.StringIO()
    with Progress("job", total=10, unit="req", mode="off", stream=out) as bar:
        bar.update(5)
    assert out.getvalue() == ""


@pytest.mark.parametrize(
    ("argv", "start"),
    [
        (["check", "--scope", "tiny", "--no-model"], "check tiny: 764 states ["),
        (["check", "--scope", "tiny", "--walks", "3", "--walk-depth", "4"], "check tiny: 100% 3/3 walks"),
        (["replay", SEED_001], "replay 001_prefix_hit_walkthrough.kvlog: 100% "),
        (["simulate", "--sample", "--limit", "20", "--capacity", "1M"], "lru @ 1,000,000 tokens: 100% 20/20"),
    ],
)
def test_progress_off_a_terminal_prints_plain_lines(
    capsys: pytest.CaptureFixture[str], argv: list[str], start: str
) -> None:
    # Regression: check printed nothing for minutes; replay and minimize had no --progress off a tty.
    code = main([*argv, "--progress"])
    assert code in (0, 1)  # three short walks may miss a SOMETIMES probe
    err = capsys.readouterr().err.splitlines()
    assert any(line.startswith(start) for line in err), err


def test_minimize_progress(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["minimize", DOUBLE_FREE, "-o", str(tmp_path / "m.kvlog"), "--progress"]) == 0
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("minimize:") and "/20000 replays" in line and "1 events left" in line


def test_no_progress_and_no_terminal_print_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", SEED_001]) == 0
    assert capsys.readouterr().err == ""


# --- slow settings ---------------------------------------------------------------------------


def test_replay_warns_about_per_event_checks_on_a_large_log(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_advice, "CHECKED_EVENTS_WARN", 10)  # the seed log stands in for a large one
    assert main(["replay", SEED_001]) == 0
    (warning,) = capsys.readouterr().err.splitlines()
    assert warning.startswith("kvstate replay: warning: about ") and "--check-every 1000" in warning
    assert main(["replay", SEED_001, "--check-every", "64"]) == 0
    assert capsys.readouterr().err == ""


def test_replay_advice_scales_with_the_log() -> None:
    assert _advice.replay_advice(1_000_000, 1) == []  # ~22k events: below the advice threshold
    assert _advice.replay_advice(None, 1) == []  # the bundled demo
    (message,) = _advice.replay_advice(100_000_000, 1)
    assert "about 2,173,913 events" in message
    assert _advice.replay_advice(100_000_000, 1000) == []
    assert _advice.replay_advice(10_000_000, 1) == []  # ~217k events, incremental: no advice
    (message,) = _advice.replay_advice(10_000_000, 1, full=True)
    assert "from scratch" in message and "incremental" in message


def test_check_advice_names_workers_for_a_slow_scope() -> None:
    (message,) = _advice.check_advice("planner-paged", workers=1, walks=0, max_states=None, cpus=2)
    assert "about 3 minutes" in message and "--workers 2" in message
    assert _advice.check_advice("planner-paged", workers=2, walks=0, max_states=None, cpus=2) == []
    assert _advice.check_advice("planner-paged", workers=1, walks=50, max_states=None, cpus=2) == []
    assert _advice.check_advice("planner-paged", workers=1, walks=0, max_states=None, cpus=1) == []
    assert _advice.check_advice("tiny", workers=1, walks=0, max_states=None, cpus=2) == []


def test_check_prints_the_warning_before_searching(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_advice, "SLOW_SCOPES", {"tiny": "slow (pretend)"})
    monkeypatch.setattr(_advice.os, "cpu_count", lambda: 4)
    assert main(["check", "--scope", "tiny", "--no-model"]) == 0
    (warning,) = capsys.readouterr().err.splitlines()
    assert warning == ("kvstate check: warning: scope tiny is slow (pretend) on one process; --workers 4 "
                       "searches the same states on 4 processes (1.6-2x faster on 2 cores)")


def _scan(granularity: str, tokens: int, unit: int, page_bound: int = 1000) -> TraceScan:
    from kvstate.traces import TraceRequest

    first = TraceRequest("r", 0, 0.0, 600, 0, "t.jsonl", block_size=512, block_keys=(0, 1),
                         block_token_counts=(512, 88))
    return TraceScan(first, 10, page_bound, tokens, 0, granularity, unit)  # type: ignore[arg-type]


def test_simulate_advice() -> None:
    (token,) = _advice.simulate_advice(_scan("token", 5_000_000, 16), "node", [10])
    assert "--granularity block" in token and "32 per trace block" in token
    assert _advice.simulate_advice(_scan("block", 5_000_000, 512), "node", [10]) == []
    (roomy,) = _advice.simulate_advice(_scan("block", 5_000_000, 512), "page", [1000, 5000])
    assert "nothing is ever evicted" in roomy and "--eviction-unit node" in roomy
    assert _advice.simulate_advice(_scan("block", 5_000_000, 512), "page", [999]) == []
    token, split = _advice.simulate_advice(_scan("token", 5_000_000, 16), "page", [10])
    assert "about 6x slower than --eviction-unit node" in split


def test_simulate_warns_that_page_eviction_changes_nothing_at_a_huge_capacity(
    capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--sample", "--limit", "20", "--capacity", "1e12", "--eviction-unit", "page"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    (warning,) = captured.err.splitlines()
    assert warning.startswith("kvstate simulate: warning: every capacity holds the whole trace")
    assert "evicted 0 blocks" in captured.out
