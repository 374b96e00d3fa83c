"""Benchmarks for event logs: replay throughput, recorder overhead, reader memory.

    python tools/bench_log.py [--requests N] [--big-events N] [--workdir DIR] [--out FILE]

* replay throughput (events/s) on a recorded synthetic SGLang workload:
  decode only; replay with no invariant checks; checks every 1000 events;
  checks every event (on a prefix, it is slow);
* recorder overhead (us/event): the recorder's own work per event (encode,
  frame, buffer, flush) fed the recorded events directly, and the whole live
  run with and without a recorder attached (which also includes the engine's
  per-event listener path);
* reader memory: peak RSS of a fresh process that reads a log of
  ``--big-events`` (default 10M) events, against one that reads 10k events.
  The big log is generated under ``--workdir`` (default: the system temp
  directory), never in the repository.

Every timing is the best of ``--repeat`` runs, in process CPU seconds
(``time.process_time``) and wall seconds, because the machine may be shared.
Results are printed and, with ``--out``, written as a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvstate.events import Allocate, Append, Event, Free, ReqAlloc, ReqFree
from kvstate.log import LogReader, LogWriter, Recorder, make_header, replay
from kvstate.log.synthetic import SyntheticRun, WorkloadSpec, run_synthetic
from kvstate.reducer import apply
from kvstate.state import Geometry, initial_state
from kvstate.transient import TransientApplier

REPO = Path(__file__).resolve().parent.parent


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, float, Any]:
    """(best CPU seconds, best wall seconds, last result) over ``repeat`` runs."""
    cpu = wall = float("inf")
    result = None
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        result = fn()
        cpu = min(cpu, time.process_time() - c0)
        wall = min(wall, time.perf_counter() - w0)
    return cpu, wall, result


def record_workload(spec: WorkloadSpec, path: Path) -> int:
    recorders: list[Recorder] = []
    run_synthetic(spec, attach=lambda r: recorders.append(
        Recorder(r.engine, path, fsync=False)), keep_events=False)
    recorders[0].close()
    return recorders[0].count


def decode_only(path: Path) -> int:
    with LogReader(path) as reader:
        count = 0
        for _ in reader.events():
            count += 1
    return count


def replay_with(path: Path, check_every: int, until: int | None = None,
                fast: bool | None = False) -> int:
    with LogReader(path) as reader:
        result = replay(reader, check_every=check_every, until=until, fast=fast)
    if result.failure is not None:
        raise RuntimeError(result.failure.describe())
    return result.summary.events


def apply_only(geometry: Geometry, events: list[Event]) -> int:
    state = initial_state(geometry)
    for evt in events:
        state = apply(state, evt)
    return len(events)


def transient_only(geometry: Geometry, events: list[Event]) -> int:
    applier = TransientApplier(initial_state(geometry))
    for evt in events:
        applier.apply(evt)
    applier.state()  # one freeze at the end, as a replay does
    return len(events)


def recorder_own_cost(geometry: Geometry, events: list[Event], path: Path,
                      checkpoint_every: int | None) -> int:
    """Feed the recorder listener directly (states precomputed): its own cost per event."""
    state = initial_state(geometry)
    states = []
    for evt in events:
        state = apply(state, evt)
        states.append(state)
    from kvstate.engine import Engine

    engine = Engine(geometry)
    recorder = Recorder(engine, path, checkpoint_every=checkpoint_every, fsync=False)
    listener = recorder._on_event  # noqa: SLF001 - measuring the listener itself
    c0 = time.process_time()
    for evt, after in zip(events, states, strict=True):
        listener(evt, after)
    recorder.writer.close(state.fingerprint())  # type: ignore[union-attr]
    return int((time.process_time() - c0) * 1e9)


def live_run(spec: WorkloadSpec, mode: str, path: Path) -> int:
    def attach(run: SyntheticRun) -> None:
        if mode == "noop":
            run.engine.subscribe(lambda event, state: None)
        elif mode == "recorder":
            holder.append(Recorder(run.engine, path, fsync=False))

    holder: list[Recorder] = []
    run = run_synthetic(spec, attach=attach, keep_events=False)
    if holder:
        holder[0].close()
    return run.engine.state.seq


def write_cycle_log(path: Path, events: int) -> None:
    """A valid log of ``events`` events that cycles one request through alloc/free (flat state)."""
    geometry = Geometry(num_pages=64, page_size=16, num_rows=4, row_width=1024)
    cycle: list[Event] = [ReqAlloc((1,)), Allocate((1, 2), ((1, tuple(range(16, 48))),)),
                          Append(((1, 32),)), ReqFree((1,)), Free((1, 2), at_head=True)]
    state = initial_state(geometry)
    for evt in cycle:
        state = apply(state, evt)
    writer = LogWriter(path, make_header(geometry, checkpoint_every=0), fsync=False,
                       flush_bytes=1 << 20)
    full, rest = divmod(events, len(cycle))
    for _ in range(full):
        for evt in cycle:
            writer.write_event(evt)
    for evt in cycle[:rest]:
        writer.write_event(evt)
    writer.close(b"\0" * 16)  # the end fingerprint is not checked by a decode-only read


# VmHWM (this process's peak RSS, kB) rather than ru_maxrss, which Linux carries over
# from the parent across fork + exec.
MEMORY_CHILD = """
import sys, time
from kvstate.log import LogReader

def hwm():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))

base = hwm()
t0 = time.perf_counter()
count = 0
with LogReader(sys.argv[1]) as reader:
    for _ in reader.events():
        count += 1
print(count, base, hwm(), time.perf_counter() - t0)
"""


def reader_memory(path: Path) -> tuple[int, int, int, float]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(path)], capture_output=True,
                         text=True, env=env, check=True).stdout.split()
    return int(out[0]), int(out[1]), int(out[2]), float(out[3])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--big-events", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where to write the logs (default: a new temporary directory)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", choices=("all", "throughput", "memory"), default="all")
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="kvstate-bench-log-"))
    work.mkdir(parents=True, exist_ok=True)
    spec = WorkloadSpec(requests=args.requests, seed=1, page_size=args.page_size,
                        capacity=4096 * args.page_size // 4, max_running=16)
    rows: list[tuple[str, str, str]] = []
    if args.only in ("all", "throughput"):
        throughput(args, spec, work, rows)
    if args.big_events and args.only in ("all", "memory"):
        memory(args, work, rows)
    header = [f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
              f"load average at the end {os.getloadavg()[0]:.1f}.",
              f"Workload: synthetic SGLang, {args.requests} requests, page size {args.page_size}.", ""]
    table = ["| measurement | result | notes |", "| --- | --- | --- |"]
    table += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    text = "\n".join(header + table) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
    return 0


def throughput(args: argparse.Namespace, spec: WorkloadSpec, work: Path,
               rows: list[tuple[str, str, str]]) -> None:
    log = work / "bench_workload.kvlog"
    count = record_workload(spec, log)
    size = log.stat().st_size
    with LogReader(log) as reader:
        events = list(reader.events())

    def rate(label: str, fn: Callable[[], int], note: str = "") -> None:
        cpu, wall, n = best(fn, args.repeat)
        rows.append((label, f"{n / cpu:,.0f} events/s (CPU), {n / wall:,.0f} (wall)", note))
        print(rows[-1])

    note = f"{count} events, {size / count:.1f} bytes/event"
    rate("decode only (read, CRC, msgpack, build events)", lambda: decode_only(log), note)
    rate("pure reducer only (events in memory, no decode)",
         lambda: apply_only(spec.geometry, events))
    rate("transient reducer only (events in memory, no decode, one freeze)",
         lambda: transient_only(spec.geometry, events))
    rate("replay, no invariant checks, pure reducer (decode + reduce + summary + checkpoints)",
         lambda: replay_with(log, 0))
    rate("replay, no invariant checks, transient reducer (the default for --check-every 0)",
         lambda: replay_with(log, 0, fast=True))
    rate("replay, invariants every 1000 events, pure reducer", lambda: replay_with(log, 1000))
    rate("replay, invariants every 1000 events, transient reducer (the default)",
         lambda: replay_with(log, 1000, fast=True))
    prefix = min(count, 5000)
    rate("replay, invariants every event", lambda: replay_with(log, 1, prefix),
         f"first {prefix} events")

    for every, label in ((0, "no checkpoints"), (4096, "checkpoint every 4096"),
                         (None, "automatic checkpoint interval")):
        own = min(recorder_own_cost(spec.geometry, events, work / "own.kvlog", every)
                  for _ in range(args.repeat))
        rows.append((f"recorder's own work per event, {label}",
                     f"{own / 1000 / count:.2f} us/event",
                     "listener fed precomputed states (encode, frame, buffer, flush, fingerprints)"))
        print(rows[-1])
    base_cpu, base_wall, seq = best(lambda: live_run(spec, "none", log), args.repeat)
    noop_cpu, _, _ = best(lambda: live_run(spec, "noop", log), args.repeat)
    rec_cpu, rec_wall, _ = best(lambda: live_run(spec, "recorder", work / "live.kvlog"), args.repeat)
    rows.append(("live run, no listener", f"{base_cpu / seq * 1e6:.2f} us/event", f"{seq} events"))
    rows.append(("live run, no-op listener (engine re-applies plan events for listeners)",
                 f"{noop_cpu / seq * 1e6:.2f} us/event",
                 f"+{(noop_cpu - base_cpu) / seq * 1e6:.2f} us/event"))
    rows.append(("live run, recorder attached", f"{rec_cpu / seq * 1e6:.2f} us/event",
                 f"+{(rec_cpu - base_cpu) / seq * 1e6:.2f} us/event over no listener, "
                 f"+{(rec_cpu - noop_cpu) / seq * 1e6:.2f} over a no-op listener"))
    for row in rows[-3:]:
        print(row)


def memory(args: argparse.Namespace, work: Path, rows: list[tuple[str, str, str]]) -> None:
    big = work / "bench_big.kvlog"
    small = work / "bench_small.kvlog"
    c0 = time.perf_counter()
    write_cycle_log(big, args.big_events)
    write_seconds = time.perf_counter() - c0
    write_cycle_log(small, 10_000)
    n_small, base_small, peak_small, _ = reader_memory(small)
    n_big, base_big, peak_big, seconds = reader_memory(big)
    rows.append(("reader peak RSS, 10k-event log", f"{peak_small / 1024:.1f} MiB",
                 f"{base_small / 1024:.1f} MiB after imports"))
    rows.append((f"reader peak RSS, {n_big:,}-event log ({big.stat().st_size / 2**20:,.0f} MiB)",
                 f"{peak_big / 1024:.1f} MiB",
                 f"{base_big / 1024:.1f} MiB after imports; read in {seconds:.1f} s "
                 f"({n_big / seconds:,.0f} events/s); written in {write_seconds:.1f} s"))
    for row in rows[-2:]:
        print(row)
    big.unlink()
    small.unlink()


if __name__ == "__main__":
    sys.exit(main())
