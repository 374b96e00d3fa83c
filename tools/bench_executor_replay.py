"""Executor replay throughput: ``replay_hook`` (what ``kvstate replay --executor cpu`` runs).

Replays each log into fresh buffers with integrity mode on and reports
events per second, by process CPU time and by wall time (best and median of
``--repeats`` runs; the CPU time is the steadier number on a shared
machine).  Modes, as the CLI's ``--check-every`` would run them:

    incremental  check after every event, only what changed (the default CLI run)
    full         a full verification after every event (the old behaviour)
    end          one full verification at the end only

Every mode ends with one full verification, counted in its time.  By
default the logs are the ``replay/`` corpus logs that replay cleanly plus a
synthetic log recorded here (``kvstate record --workload synthetic
--requests 200 --seed 1 --page-size 4``).

SWA logs (FULL + SWA hybrids, ``--swa``, on by default) are recorded here from
the SGLang front end: seeded op lists of ``tools/diff_sglang_hybrid.py``
(small pools: evictions, tombstones, recoveries at almost every step) and a
decode-heavy serving run (``swa_serving``: shared system prompts, a batch of
up to 8 requests, window 32, out-of-window frees every 16 tokens).  They
replay on the SWA executor with the window from the log's meta; ``--swa``
also times each log's incremental mode with the window unknown
(``nowindow``) and on the single-pool executor that mirrors the FULL pool
only (``fullpool``: what the executor did before it held SWA layers).  Mamba logs
(``--mamba``, on by default; ``tools/bench_executor_mamba.py``) replay with the Mamba
states, and again without them (``nomamba``).  ``--baseline TREE`` also times
the executor of another source tree (e.g. ``git archive HEAD | tar -x -C
../kvstate-head``: the code before the incremental checks), in a subprocess, on
the same corpus logs in the same run, and on the same synthetic workload
recorded by that tree (an older reader refuses a newer log format).

Usage (from the repository root)::

    python tools/bench_executor_replay.py
    python tools/bench_executor_replay.py --modes incremental end --repeats 5
    python tools/bench_executor_replay.py --baseline ../kvstate-head --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from bench_executor_mamba import EXTRA as MAMBA_EXTRA
from bench_executor_mamba import OPTIONS as MAMBA_OPTIONS
from bench_executor_mamba import mamba_logs
from bench_executor_swa import SWA_EXTRA, record_swa_seeds, swa_serving

from kvstate.executor import replay_hook, swa_window_of
from kvstate.log import read_events
from kvstate.state import initial_state

ROOT = Path(__file__).resolve().parent.parent
MODES = {"incremental": (1, False), "full": (1, True), "end": (0, False)}  # check_every, full

# Times the old executor (HEAD before the port: TieredState, kvstate.log.replay.start_state)
# in a subprocess whose sys.path starts with the baseline tree.
_BASELINE = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
from kvstate.executor import replay_hook
from kvstate.log import read_events
from kvstate.log.replay import start_state
logs, modes, repeats = json.loads(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
out = []
for path in logs:
    header, events = read_events(path)
    events = list(events)
    for mode, (every, full) in modes.items():
        if full:
            continue  # the old code has only full checks: "incremental" below is them
        cpu, wall = [], []
        for _ in range(repeats):
            start_cpu, start_wall = time.process_time(), time.perf_counter()
            result = replay_hook((start_state(header), events), "cpu", check_every=every)
            cpu.append(time.process_time() - start_cpu)
            wall.append(time.perf_counter() - start_wall)
        label = "each (full)" if every else mode  # the old code's checks are all full
        out.append({"log": path, "mode": label, "events": len(events), "ok": result.ok,
                    "cpu": cpu, "wall": wall})
print(json.dumps(out))
"""


def corpus_logs() -> list[Path]:
    """Corpus logs that replay to the end (the failing, findings and malformed ones stop early)."""
    logs = []
    for folder in ("seed", "synthetic", "tiered", "vllm"):
        logs.extend(sorted((ROOT / "replay" / folder).glob("*.kvlog")))
    return logs


def record_synthetic(folder: Path, tree: Path = ROOT) -> Path:
    """``kvstate record --workload synthetic --requests 200 --seed 1 --page-size 4`` with the
    code of ``tree`` (each tree reads the log format it writes)."""
    path = folder / f"synthetic_200_s1_p4{'' if tree == ROOT else '_baseline'}.kvlog"
    subprocess.run([sys.executable, "-m", "kvstate.cli", "record", "--workload", "synthetic",
                    "--requests", "200", "--seed", "1", "--page-size", "4", "-o", str(path)],
                   check=True, cwd=tree, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": str(tree)})
    return path


def time_log(path: Path, modes: list[str], repeats: int, swa_extra: bool = False
             ) -> list[dict[str, Any]]:
    header, events = read_events(path)
    start = initial_state(header.geometry, host_pages=header.host_pages,
                          swa_pages=header.swa_pages, mamba_slots=header.mamba_slots)
    window = swa_window_of(header.meta)
    base = {"swa_window": window, **(MAMBA_OPTIONS if header.mamba_slots else {})}
    runs: list[tuple[str, int, bool, dict[str, Any]]] = [
        (mode, *MODES[mode], base) for mode in modes]
    if header.mamba_slots:
        runs += [(name, 1, False, {**base, **extra}) for name, extra in MAMBA_EXTRA.items()]
    elif swa_extra and header.swa_pages:
        runs += [(name, 1, False, {"swa_window": window, **extra})
                 for name, extra in SWA_EXTRA.items()]
    rows = []
    for mode, every, full, options in runs:
        cpu, wall = [], []
        result = None
        for _ in range(repeats):
            start_cpu, start_wall = time.process_time(), time.perf_counter()
            result = replay_hook((start, events), "cpu", check_every=every, full_checks=full,
                                 **options)
            cpu.append(time.process_time() - start_cpu)
            wall.append(time.perf_counter() - start_wall)
        assert result is not None
        rows.append({"log": str(path), "mode": mode, "events": len(events), "ok": result.ok,
                     "cpu": cpu, "wall": wall})
    return rows


def baseline(tree: Path, logs: list[Path], modes: list[str], repeats: int) -> list[dict[str, Any]]:
    chosen = {mode: MODES[mode] for mode in modes}
    done = subprocess.run([sys.executable, "-c", _BASELINE, str(tree), json.dumps(
        [str(p) for p in logs]), json.dumps(chosen), str(repeats)],
        capture_output=True, text=True, cwd=tree)
    if done.returncode:
        raise SystemExit(f"the baseline run failed:\n{done.stderr}")
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def summary(row: dict[str, Any]) -> dict[str, Any]:
    events = row["events"]
    return {**row, "cpu_best": min(row["cpu"]), "wall_best": min(row["wall"]),
            "events_per_s_cpu": events / min(row["cpu"]),
            "events_per_s_cpu_median": events / statistics.median(row["cpu"]),
            "events_per_s_wall": events / min(row["wall"])}


def print_table(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{title}")
    print(f"{'log':<48} {'mode':<12} {'events':>6} {'ok':>3} {'cpu s':>8} {'ev/s cpu':>9} "
          f"{'median':>9} {'ev/s wall':>9}")
    for row in rows:
        print(f"{Path(row['log']).name:<48} {row['mode']:<12} {row['events']:>6} "
              f"{'y' if row['ok'] else 'N':>3} {row['cpu_best']:>8.3f} "
              f"{row['events_per_s_cpu']:>9.0f} {row['events_per_s_cpu_median']:>9.0f} "
              f"{row['events_per_s_wall']:>9.0f}")
    for mode in dict.fromkeys(r["mode"] for r in rows):
        chosen = [r for r in rows if r["mode"] == mode]
        events = sum(r["events"] for r in chosen)
        print(f"{'all logs together':<48} {mode:<12} {events:>6}     "
              f"{sum(r['cpu_best'] for r in chosen):>8.3f} "
              f"{events / sum(r['cpu_best'] for r in chosen):>9.0f} {'':>9} "
              f"{events / sum(r['wall_best'] for r in chosen):>9.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("logs", nargs="*", help="logs to replay (default: corpus + synthetic)")
    parser.add_argument("--modes", nargs="+", default=["incremental", "end"], choices=list(MODES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another source tree whose executor to time as well (subprocess)")
    parser.add_argument("--baseline-repeats", type=int, default=1,
                        help="runs per log and mode for the baseline (slow: full checks)")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--swa", action=argparse.BooleanOptionalAction, default=True,
                        help="record and time SWA logs too (and their nowindow/fullpool rows)")
    parser.add_argument("--only-swa", action="store_true", help="time the SWA logs only")
    parser.add_argument("--mamba", action=argparse.BooleanOptionalAction, default=True,
                        help="record and time Mamba logs too (and their nomamba rows)")
    parser.add_argument("--only-mamba", action="store_true", help="time the Mamba logs only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        logs = [Path(p) for p in args.logs]
        only = args.only_swa or args.only_mamba
        if not logs and not only:
            logs = [*corpus_logs(), record_synthetic(Path(scratch))]
        if not args.logs and (args.only_swa or (args.swa and not only)):
            logs += [*record_swa_seeds(Path(scratch)),
                     swa_serving(Path(scratch) / "swa_serving_p4_w32.kvlog")]
        if not args.logs and (args.only_mamba or (args.mamba and not only)):
            logs += mamba_logs(Path(scratch))
        rows = [summary(row) for path in logs
                for row in time_log(path, args.modes, args.repeats, args.swa)]
        before = []
        if args.baseline:
            theirs = [Path(p) for p in args.logs] or [
                *corpus_logs(), record_synthetic(Path(scratch), args.baseline.resolve())]
            before = [summary(row) for row in baseline(args.baseline, theirs, args.modes,
                                                       args.baseline_repeats)]
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"torch {torch.__version__}, 1 thread, load average {load}, best of {args.repeats}")
    print_table("this tree", rows)
    if before:
        print_table(f"baseline {args.baseline} (best of {args.baseline_repeats})", before)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"load_average": load, "repeats": args.repeats, "rows": rows,
                       "baseline": before}, handle, indent=2)


if __name__ == "__main__":
    main()
