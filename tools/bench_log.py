"""Benchmarks for event logs: verify, decode and replay throughput, and where replay's time goes.

    python tools/bench_log.py [--requests N] [--vllm-requests N] [--repeat R] [--profile]
                              [--workdir DIR] [--out FILE]

For three logs (the synthetic SGLang workload at page sizes 1 and 16, and a
vLLM-style block-mode run; ``tools/log_workloads.py``) it measures:

* ``kvstate verify`` (framing, CRCs and digests; no event decoded), MB/s;
* decoding only (read, CRC, typed decode into events);
* recording: what a ``Recorder`` adds per event to a live engine applying
  the log's events one batch each (the worst case: most front-end decisions
  commit several events in one batch), checkpoints and writes included,
  timed as a pair of engines fed in lockstep (one records, one does not);
* replay on the live backend with no invariant checks, checks every 1000
  events and checks after every event (incremental), and with checks after
  every event on the persistent backend (from scratch, for reference, on a
  prefix);

every timing the best of ``--repeat`` runs in process CPU seconds, because
the machine may be shared.  ``--profile`` adds a cProfile of a no-check
replay grouped by who owns the time: the reader, the event codec, the
replay loop and its summary, the rules and backends, the invariant checks.
Logs are written under ``--workdir`` (default: a new temporary directory),
never in the repository.  Results are printed and, with ``--out``, written
as Markdown.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from log_workloads import record_sglang, record_vllm  # noqa: E402

from kvstate.log import LogReader  # noqa: E402
from kvstate.log.verify import verify_log  # noqa: E402
from kvstate.replay import replay  # noqa: E402

Row = tuple[str, str, str, str]
AREAS = (("reader", ("kvstate/log/",)), ("codec", ("kvstate/events/", "msgspec")),
         ("replay loop + summary", ("kvstate/replay/",)),
         ("rules + backends", ("kvstate/rules/", "kvstate/backends/", "kvstate/freequeue",
                               "kvstate/records", "kvstate/state", "immutables")),
         ("invariant checks", ("kvstate/invariants/",)), ("fingerprints", ("kvstate/canonical",)))


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """(best CPU seconds, last result) over ``repeat`` runs."""
    cpu = float("inf")
    result = None
    for _ in range(repeat):
        start = time.process_time()
        result = fn()
        cpu = min(cpu, time.process_time() - start)
    return cpu, result


def decode_only(path: Path) -> int:
    with LogReader(path) as reader:
        return sum(1 for _ in reader.events())


def rules_only(path: Path) -> int:
    """The live backend applying the log's events from memory (no reader, no summary)."""
    from kvstate.backends.live import LiveState
    from kvstate.replay import start_state

    with LogReader(path) as reader:
        events = list(reader.events())
        live = LiveState.thaw(start_state(reader.header))
    apply = live.apply
    started = time.process_time()
    for event in events:
        apply(event)
    return len(events), time.process_time() - started  # type: ignore[return-value]


def recording_cost(path: Path, work: Path, repeat: int) -> tuple[float, float]:
    """(µs per event of a live engine committing the log's events one batch each, µs per
    event a ``Recorder`` on that engine adds), the median of ``repeat`` paired runs.

    The two engines, one plain and one recording, take the events in lockstep, 256 at a
    time and in alternating order, each timed on the thread's CPU clock: a slow spell of a
    shared machine lands on both alike, so their difference is the recorder's cost (the
    checkpoints and the last block's seal included; the end record, once per log, not).
    """
    from kvstate.engine import Engine
    from kvstate.log import Recorder
    from kvstate.replay import start_state

    with LogReader(path) as reader:
        events = list(reader.events())
        state = start_state(reader.header)
    chunks = [events[i:i + 256] for i in range(0, len(events), 256)]
    clock = time.thread_time

    def feed(engine: Engine, chunk: list[Any]) -> float:
        started = clock()
        for event in chunk:
            with engine.batch() as batch:
                batch.emit(event)
        return clock() - started

    plain_runs, extra_runs = [], []
    for _ in range(repeat):
        plain, recording = Engine(state=state, keep_events=False), \
            Engine(state=state, keep_events=False)
        recorder = Recorder(recording, work / "rerecorded.kvlog", fsync=False)
        plain_cpu = recorded_cpu = 0.0
        for index, chunk in enumerate(chunks):
            if index % 2:
                recorded_cpu += feed(recording, chunk)
                plain_cpu += feed(plain, chunk)
            else:
                plain_cpu += feed(plain, chunk)
                recorded_cpu += feed(recording, chunk)
        started = clock()
        recorder.flush()  # seals the last block
        recorded_cpu += clock() - started
        recorder.close()  # the end record's fingerprint is once per log, not per event
        plain_runs.append(plain_cpu)
        extra_runs.append(recorded_cpu - plain_cpu)
    return (statistics.median(plain_runs) / len(events) * 1e6,
            statistics.median(extra_runs) / len(events) * 1e6)


def replay_count(path: Path, check_every: int, backend: str = "live",
                 until: int | None = None, full: bool = False) -> int:
    with LogReader(path) as reader:
        result = replay(reader, check_every=check_every, backend=backend, until=until,
                        full_checks=full)
    if result.failure is not None and not result.stopped_early:
        raise RuntimeError(result.failure.describe())
    return result.summary.events


def measure(name: str, path: Path, repeat: int, work: Path) -> list[Row]:
    size = path.stat().st_size
    rows: list[Row] = []

    def rate(label: str, fn: Callable[[], int], note: str = "") -> None:
        cpu, count = best(fn, repeat)
        rows.append((name, label, f"{count / cpu:,.0f} events/s", note))
        print(rows[-1], flush=True)

    cpu, found = best(lambda: verify_log(path), repeat)
    rows.append((name, "kvstate verify (framing, CRCs, digests)",
                 f"{size / cpu / 1e6:,.0f} MB/s, {found.events / cpu:,.0f} events/s",
                 f"{found.events:,} events in {found.records:,} records, "
                 f"{size / found.events:.1f} bytes/event"))
    print(rows[-1], flush=True)
    rate("decode only (read, CRC, typed decode)", lambda: decode_only(path))
    rules = min(rules_only(path)[1] for _ in range(repeat))
    count = found.events
    rows.append((name, "rules only (live backend, events in memory)",
                 f"{count / rules:,.0f} events/s", "no reader, no summary"))
    print(rows[-1], flush=True)
    engine_us, record_us = recording_cost(path, work, repeat)
    rows.append((name, "recording (a Recorder on a live engine, one event per batch)",
                 f"{record_us:.2f} µs/event on top of the engine",
                 f"the engine alone: {engine_us:.2f} µs/event"))
    print(rows[-1], flush=True)
    rate("replay, no checks (live)", lambda: replay_count(path, 0))
    rate("replay, checks every 1000 (live, incremental)", lambda: replay_count(path, 1000))
    rate("replay, checks after every event (live, incremental)", lambda: replay_count(path, 1))
    prefix = 3000
    rate("replay, checks after every event (persistent, full)",
         lambda: replay_count(path, 1, "persistent", prefix), f"first {prefix} events")
    return rows


def profile(path: Path) -> list[tuple[str, float]]:
    """Share of a no-check replay's time per area (``AREAS``), by each function's own time;
    a builtin's time (``len``, ``dict.get``, a C decoder) goes to the areas of its callers."""
    profiler = cProfile.Profile()
    with LogReader(path) as reader:
        profiler.enable()
        replay(reader, check_every=0)
        profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]

    def area_of(key: tuple[str, int, str]) -> str:
        where = f"{key[0]}:{key[2]}"
        return next((label for label, keys in AREAS if any(k in where for k in keys)), "other")

    totals: dict[str, float] = {}
    for key, (_, _, own, _, callers) in stats.items():
        if key[0] == "~" and callers:  # a builtin: split its time over its callers
            for caller, (_, _, caller_own, _) in callers.items():
                area = area_of(caller)
                totals[area] = totals.get(area, 0.0) + caller_own
            continue
        area = area_of(key)
        totals[area] = totals.get(area, 0.0) + own
    whole = sum(totals.values())
    return sorted(((area, share / whole) for area, share in totals.items()), key=lambda x: -x[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--vllm-requests", type=int, default=6000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="kvstate-bench-log-"))
    work.mkdir(parents=True, exist_ok=True)
    logs = {"SGLang p1": work / "sglang_p1.kvlog", "SGLang p16": work / "sglang_p16.kvlog",
            "vLLM b16": work / "vllm_b16.kvlog"}
    record_sglang(logs["SGLang p1"], args.requests, 1)
    record_sglang(logs["SGLang p16"], args.requests, 16)
    record_vllm(logs["vLLM b16"], args.vllm_requests)
    rows = [row for name, path in logs.items()
            for row in measure(name, path, args.repeat, work)]
    lines = [f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
             f"{platform.python_version()}; load average at the end {os.getloadavg()[0]:.1f}. "
             f"Best of {args.repeat}, process CPU time.", "",
             "| log | measurement | result | notes |", "| --- | --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    if args.profile:
        for name, path in logs.items():
            shares = ", ".join(f"{area} {share:.0%}" for area, share in profile(path))
            lines.append(f"\nProfile of a no-check replay of {name}: {shares}.")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
