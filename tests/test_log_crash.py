"""Crash safety: a recording process killed with SIGKILL leaves a log whose whole records replay.

The child records an endless synthetic workload and prints the live state's
fingerprint each time the recorder writes a checkpoint (after the recorder
has handed it to the OS).  The parent kills it mid-run, salvages the log and
checks that the replayed states match the live fingerprints at every
checkpoint it saw, and that the log's own checkpoints verify.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvstate.log import LogReader
from kvstate.replay import replay

REPO = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent("""
    import sys
    from kvstate.log import Recorder
    from kvstate.workloads.synthetic import WorkloadSpec, run_synthetic

    path, every = sys.argv[1], int(sys.argv[2])
    spec = WorkloadSpec(requests=10**6, seed=21, page_size=4, capacity=512, max_running=4)

    def attach(run):
        recorder = Recorder(run.engine, path, checkpoint_every=every, flush_bytes=700)

        def announce(event, state):
            if recorder.count % every == 0:
                print(recorder.count, state.fingerprint().hex(), flush=True)

        run.engine.subscribe(announce)

    run_synthetic(spec, attach=attach, keep_events=False)
""")


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
@pytest.mark.parametrize("checkpoints_before_kill", [5])
def test_sigkilled_writer_leaves_a_replayable_prefix(tmp_path, checkpoints_before_kill):
    path = tmp_path / "crash.kvlog"
    every = 40
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(every)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             cwd=str(REPO))
    live: dict[int, str] = {}
    try:
        assert child.stdout is not None
        for line in child.stdout:
            seq, fingerprint = line.split()
            live[int(seq)] = fingerprint
            if len(live) >= checkpoints_before_kill:
                break
    finally:
        child.send_signal(signal.SIGKILL)
        _, err = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL, err
    assert len(live) == checkpoints_before_kill, err

    seen: dict[int, str] = {}
    with LogReader(path, salvage=True) as reader:
        result = replay(reader, check_every=25,
                        on_event=lambda index, event, state: seen.__setitem__(index + 1, "")
                        if (index + 1) in live else None)
        stopped = reader.stopped
    assert result.ok, result.failure
    assert stopped is not None  # no end record: the writer never finished
    assert "end record" in stopped.reason or "truncated" in stopped.reason
    replayed = result.summary.events
    assert replayed >= max(live)  # every announced checkpoint was on disk before the print
    assert result.summary.checkpoints_verified >= len(live)

    # Replay again, capturing the replayed fingerprint at each live checkpoint.
    fingerprints: dict[int, str] = {}

    def capture(index, event, state):
        if index + 1 in live:
            fingerprints[index + 1] = state.fingerprint().hex()

    with LogReader(path, salvage=True) as reader:
        replay(reader, check_every=0, on_event=capture)
    assert fingerprints == live
