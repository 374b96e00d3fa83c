"""What every ``kvstate`` command shares: --version, exit codes of crashes and interrupts, a closed stdout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import kvstate
from kvstate import cli
from kvstate.cli import EXIT_CLOSED_STDOUT, EXIT_INTERNAL, EXIT_INTERRUPTED, main

REPO = Path(__file__).resolve().parent.parent
SEED_000 = str(REPO / "replay" / "seed" / "000_radix_example.kvlog")


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"kvstate {kvstate.__version__}"


def test_help_documents_every_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for code in (0, 1, 2, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_CLOSED_STDOUT):
        assert f"\n  {code:<4d}" in out


def _crash(args: Any) -> int:
    raise ZeroDivisionError("boom")


def _patch_command(monkeypatch: pytest.MonkeyPatch, func: Any) -> None:
    """Make ``kvstate diff`` run ``func`` (the parser is rebuilt on every ``main``)."""
    import kvstate.commands.diff as diff

    monkeypatch.setattr(diff, "run", func)
    original = diff.register

    def register(subparsers: Any) -> None:
        original(subparsers)
        subparsers.choices["diff"].set_defaults(func=func)

    monkeypatch.setattr(diff, "register", register)


def test_an_internal_error_has_its_own_exit_code_and_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Regression: an uncaught exception exited 1, the code of an invariant violation.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    _patch_command(monkeypatch, _crash)
    assert main(["diff", SEED_000, SEED_000]) == EXIT_INTERNAL
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("kvstate diff: internal error (ZeroDivisionError: boom)")
    (written,) = tmp_path.glob("kvstate-crash-*.txt")
    assert str(written) in err[0]
    assert "Traceback" in written.read_text() and "_crash" in written.read_text()


def test_debug_prints_the_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _patch_command(monkeypatch, _crash)
    assert main(["--debug", "diff", SEED_000, SEED_000]) == EXIT_INTERNAL
    err = capsys.readouterr().err
    assert "Traceback" in err and "ZeroDivisionError: boom" in err


def test_ctrl_c_exits_130_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(args: Any) -> int:
        raise KeyboardInterrupt

    _patch_command(monkeypatch, interrupted)
    assert main(["diff", SEED_000, SEED_000]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err.strip() == "kvstate diff: interrupted"


def test_an_unwritable_output_path_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "no-such-dir" / "min.kvlog"
    failing = str(REPO / "replay" / "failing" / "double_free.kvlog")
    assert main(["minimize", failing, "-o", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(target) in err


def _with_closed_stdout(*argv: str) -> subprocess.CompletedProcess[bytes]:
    """Run ``kvstate argv`` with stdout a pipe already closed by its reader (``| head`` at its worst)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-m", "kvstate.cli", *argv], cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    err = process.stderr.read()
    return subprocess.CompletedProcess(argv, process.wait(), b"", err)


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        # A command with a verdict keeps it when its output is lost; the others exit 141.
        (("replay",), 0),
        (("replay", SEED_000, "--json"), 0),
        (("replay", str(REPO / "replay" / "failing" / "double_free.kvlog")), 1),
        (("check", "--list-scopes"), EXIT_CLOSED_STDOUT),
        (("diff", SEED_000, SEED_000), 0),
        (("simulate", "--sample", "--limit", "20", "--capacity", "1M"), EXIT_CLOSED_STDOUT),
        (("--help",), 0),  # argparse itself ignores a failed write of its help
    ],
    ids=lambda value: " ".join(Path(a).name for a in value) if isinstance(value, tuple) else "",
)
def test_a_closed_stdout_ends_quietly(argv: tuple[str, ...], code: int) -> None:
    # Regression: `kvstate replay LOG | head` ended with a BrokenPipeError traceback.
    result = _with_closed_stdout(*argv)
    assert result.returncode == code
    if code == 1:  # the verdict's one line goes to stderr, which is still open
        assert result.stderr.startswith(b"FAILED: ") and result.stderr.count(b"\n") == 1
    else:
        assert result.stderr == b""


def test_a_broken_pipe_that_is_not_stdout_is_an_internal_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def worker_gone(args: Any) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    _patch_command(monkeypatch, worker_gone)
    monkeypatch.setattr(cli, "_stdout_is_gone", lambda: False)
    assert main(["diff", SEED_000, SEED_000]) == EXIT_INTERNAL
    assert "internal error (BrokenPipeError" in capsys.readouterr().err


def test_ctrl_c_during_a_parallel_check_prints_one_line() -> None:
    # Regression: each forked search worker printed its own KeyboardInterrupt traceback.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "kvstate.cli", "check", "--scope", "core6", "--no-model", "--workers", "2"]
    process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(3)  # imports, then the workers are searching
    os.killpg(process.pid, signal.SIGINT)  # what a terminal does on Ctrl-C: the whole group
    _, err = process.communicate(timeout=60)
    assert process.returncode == EXIT_INTERRUPTED
    assert err.decode().strip() == "kvstate check: interrupted"
