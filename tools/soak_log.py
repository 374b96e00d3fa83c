"""Soak: record and replay millions of events and check that memory stays flat.

    python tools/soak_log.py [--events 10000000] [--workdir DIR] [--out FILE]

Records ``--events`` events through an ``Engine`` with a ``Recorder``
attached (the path a front end's events take), sampling this process's
resident set (``VmRSS``) every 1% of the way, then replays the log (live
backend, checks every 1000 events, every digest, checkpoint and the end
fingerprint verified) and samples the same way from the replay's progress
callback.  The events are one request's life repeated (open a row, allocate
two pages into it, commit, close, free), so the state itself cannot grow:
whatever grows is the log layer's.  The realistic workloads' rates are in
tools/bench_log.py.  Memory is flat
when, after the first 10% (imports, caches and the state's working set
warming up), the peak of the second half of the run is within
``--tolerance`` (5%) of the peak of the first half: memory does not grow
with the events.  The RSS at every tenth is printed too.  Not part of CI (it takes minutes); the results go in
docs/benchmarks-log.md.  Writes only under ``--workdir``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from kvstate.engine import Engine
from kvstate.events import Allocate, Append, Event, Free, ReqAlloc, ReqFree
from kvstate.log import LogReader, Recorder
from kvstate.replay import replay
from kvstate.state import Geometry

GEOMETRY = Geometry(num_pages=64, page_size=16, num_rows=4, row_width=1024)
CYCLE: list[Event] = [ReqAlloc((1,)), Allocate((1, 2), ((1, tuple(range(16, 48))),)),
                      Append(((1, 32),)), ReqFree((1,)), Free((1, 2), at_head=True)]


def record(path: Path, events: int, step: int, samples: list[tuple[int, int]]) -> int:
    """Apply ``events`` events (the cycle, repeated) with a recorder attached."""
    engine = Engine(GEOMETRY, keep_events=False)
    with Recorder(engine, path, fsync=False, flush_bytes=1 << 20) as recorder:
        apply = engine.apply
        for index in range(events):
            apply(CYCLE[index % len(CYCLE)])
            if index % step == 0:
                samples.append((index, rss_kib()))
    return recorder.count


def rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))


def flat(samples: list[tuple[int, int]], tolerance: float) -> tuple[bool, int, int]:
    """(within tolerance, min, max) of the samples after the first 10% of the events.

    Flat means no growth: the peak of the second half of the run is within
    ``tolerance`` of the peak of the first half (after the warm-up).  A leak
    grows with the events; the allocator's one-time steps (glibc raising its
    mmap threshold once a 1 MiB read buffer is freed) do not repeat.
    """
    last = samples[-1][0]
    steady = [(events, kib) for events, kib in samples if events >= last // 10]
    first = max(kib for events, kib in steady if events < last // 2)
    second = max(kib for events, kib in steady if events >= last // 2)
    low, high = min(k for _, k in steady), max(k for _, k in steady)
    return second <= first * (1 + tolerance), low, high


def series(samples: list[tuple[int, int]]) -> str:
    """RSS (MiB) at every tenth of the run."""
    last = samples[-1][0]
    marks = []
    for tenth in range(1, 11):
        events, kib = min(samples, key=lambda s: abs(s[0] - last * tenth // 10))
        marks.append(f"{kib / 1024:.1f}")
    return " ".join(marks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the log in --workdir")
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="kvstate-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    path = work / "soak.kvlog"
    step = max(args.events // 100, 1)
    recorded: list[tuple[int, int]] = []

    started = time.perf_counter()
    record(path, args.events, step, recorded)
    record_seconds = time.perf_counter() - started
    replayed: list[tuple[int, int]] = []

    def progress(events: int, offset: int) -> None:
        replayed.append((events, rss_kib()))

    started = time.perf_counter()
    with LogReader(path) as reader:
        result = replay(reader, check_every=1000, on_progress=progress, progress_every=step)
    replay_seconds = time.perf_counter() - started
    record_ok, record_low, record_high = flat(recorded, args.tolerance)
    replay_ok, replay_low, replay_high = flat(replayed, args.tolerance)
    size = path.stat().st_size
    lines = [
        f"Soak: {result.summary.events:,} events, {size / 2**20:,.0f} MiB log.",
        "",
        "| phase | time | events/s | RSS after 10% (min .. max) | flat within "
        f"{args.tolerance:.0%} |",
        "| --- | --- | --- | --- | --- |",
        f"| record (Engine.apply, recorder attached) | {record_seconds:,.0f} s | "
        f"{recorded[-1][0] / record_seconds:,.0f} | {record_low / 1024:,.1f} .. "
        f"{record_high / 1024:,.1f} MiB | {'yes' if record_ok else 'NO'} |",
        f"| replay (live, checks every 1000, fingerprints verified) | {replay_seconds:,.0f} s | "
        f"{result.summary.events / replay_seconds:,.0f} | {replay_low / 1024:,.1f} .. "
        f"{replay_high / 1024:,.1f} MiB | {'yes' if replay_ok else 'NO'} |",
        "",
        f"Replay: {'ok' if result.ok else result.failure.describe()}; "  # type: ignore[union-attr]
        f"{result.summary.checkpoints_verified} checkpoints and "
        f"{result.summary.digests_verified} digests verified.",
        "",
        f"RSS (MiB) at each tenth, record: {series(recorded)}; replay: {series(replayed)}.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
    if not args.keep:
        path.unlink()
    return 0 if record_ok and replay_ok and result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
