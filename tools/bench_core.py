"""Benchmark the core: µs per event on both backends vs pool size, and kvstate vs the peers.

    python tools/bench_core.py                        # everything, writes docs/benchmarks-core.md
    python tools/bench_core.py --skip-peers           # only the scaling table
    python tools/bench_core.py --before /path/to/old  # also the old kvstate (a checkout), same run

Part 1 applies the same event mix at 10k, 100k and 1M pages on the live and
the persistent backend and reports the median µs per event: flat numbers
mean the cost does not grow with the pool.  Each timed run starts after a
full collection (with ``--tune-gc``, after ``kvstate.tune_gc()`` too).  Part 2 runs
the peers' shared driver ``sim.py`` (one continuous-batching driver for every
peer; its directory is ``$PEERS_HARNESS``, by default ``peers/`` beside the
repository) for
kvstate through the planner (tools/peer_kvstate.py) and through SGLang's
public front-end calls (tools/peer_kvstate_sglang.py), with every event
recorded to a log, and for vLLM 0.33 and SGLang 0.5.23 in their own venvs,
interleaved, ``--repeats`` times each, reporting the median.  Phases are
timed in the driver thread's CPU time (``--clock cpu``, the default, through
tools/peer_cpu_sim.py), so other load on the machine does not move them;
``--clock wall`` keeps the driver's wall clock.  Ratios are only comparable
inside one run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kvstate import Geometry, initial_state
from kvstate.backends.live import LiveState
from kvstate.backends.persistent import apply_valid
from kvstate.events import Allocate, Append, Evict, Free, Insert, Lock, ReqAlloc, Unlock

ROOT = Path(__file__).resolve().parent.parent
PEERS_DIR = Path(os.environ.get("PEERS_HARNESS", ROOT.parent / "shared" / "peers"))
METRICS = ("us_per_decode_request_step", "us_per_admission", "us_per_finish")


# -- part 1: scaling --------------------------------------------------------------------
def _mix(num_pages: int) -> tuple[object, list[tuple[str, list[object], int]]]:
    """Half the pool allocated, every other one of those pages freed back (a quarter of
    the pool in the free queue's explicit part), and three event sequences:
    (label, events, units)."""
    size = 16
    base = initial_state(Geometry(num_pages=num_pages, page_size=size, num_rows=256,
                                  row_width=1 << 16))
    rows = tuple(range(1, 257))
    live = LiveState.thaw(base)
    live.apply(ReqAlloc(rows))
    half = tuple(live.free_pages.head(num_pages // 2))
    live.apply(Allocate(half))
    # Every other allocated page freed again: a pool that has served a while keeps a
    # quarter of its pages in the queue's explicit part, which every allocation consults.
    live.apply(Free(half[::2], at_head=False))
    base = live.freeze()
    free = base.free_pages.head(256 + 4 * 50 + 16)
    alloc_free = []
    for _ in range(100):
        pages = tuple(free[:16])
        alloc_free += [Allocate(pages), Free(pages, at_head=True)]
    decode = []
    first = tuple(free[:256])
    for step in range(16):
        fresh = first if step == 0 else ()
        decode.append(Allocate(fresh, tuple((r, (first[i] * size + step,))
                                            for i, r in enumerate(rows))))
        decode.append(Append(tuple((r, step + 1) for r in rows)))
    tree = []
    node, clock = base.next_node_id, base.clock
    for i in range(50):
        pages = tuple(free[256 + 4 * i: 260 + 4 * i])
        slots = tuple(p * size + k for p in pages for k in range(size))
        clock += 1
        tree += [Allocate(pages), Insert(0, tuple(range(i * 64, i * 64 + 64)), slots, node, clock),
                 Lock(node), Unlock(node), Evict((node,), at_head=True)]
        node += 1
    return base, [("allocate+free (16 pages)", alloc_free, len(alloc_free)),
                  ("decode step (per request-step)", decode, 16 * 256),
                  ("insert/lock/unlock/evict", tree, len(tree))]


def _median_us(run: Callable[[], None], units: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        # Setup garbage would otherwise be collected inside the timed loop: one full
        # collection of a million-page state costs as much as thousands of events.
        gc.collect()
        # CPU time of this process: the machine may be shared, and a busy neighbour
        # would otherwise show up as a cost that grows with nothing in particular.
        start = time.process_time()
        run()
        samples.append((time.process_time() - start) * 1e6 / units)
    return statistics.median(samples)


def scaling(num_pages: int, repeats: int = 5) -> dict[str, float]:
    base, mixes = _mix(num_pages)
    out: dict[str, float] = {}
    for label, events, units in mixes:
        lives = [LiveState.thaw(base) for _ in range(repeats)]  # type: ignore[arg-type]
        # Each run's final state is kept until the measurement is over: freeing a
        # million-page state when the run returns would be timed as the run's cost.
        spent: list[object] = []

        def live_run(events: list[object] = events, lives: list[LiveState] = lives,
                     spent: list[object] = spent) -> None:
            live = lives.pop()
            for event in events:
                live.apply(event)  # type: ignore[arg-type]
            spent.append(live)

        def persistent_run(events: list[object] = events, spent: list[object] = spent) -> None:
            state = base
            for event in events:
                state = apply_valid(state, event)  # type: ignore[arg-type]
            spent.append(state)

        out[f"live: {label}"] = _median_us(live_run, units, repeats)
        out[f"persistent: {label}"] = _median_us(persistent_run, units, repeats)
        spent.clear()
    return out


# -- part 2: the peers ---------------------------------------------------------------------
def run_sim(python: str, peer: str, page_size: int, extra: list[str], env: dict[str, str],
            clock: str = "cpu") -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sim.json"
        runner = [str(ROOT / "tools" / "peer_cpu_sim.py")] if clock == "cpu" else []
        cmd = [python, *runner, str(PEERS_DIR / "sim.py"), "--peer", peer, "--page-size",
               str(page_size), *extra, "--out", str(out)]
        run_env = dict(env, KVSTATE_RECORD=str(Path(tmp) / "run.kvlog"))
        subprocess.run(cmd, check=True, env=run_env, capture_output=True, cwd=PEERS_DIR)
        return json.loads(out.read_text())["runs"][0]  # type: ignore[no-any-return]


def configs(before: str | None) -> list[tuple[str, str, int, str, dict[str, str]]]:
    """(label, python, page size, peer module, environment) for every row of the table."""
    peers_home = Path(os.environ.get("PEERS", Path.home() / "kvstate-peers"))
    tools = f"{ROOT / 'tools'}:{PEERS_DIR}"
    mine = dict(os.environ, PYTHONPATH=f"{ROOT}:{tools}")
    rows = []
    for size in (16, 1):
        rows.append((f"kvstate, planner (page {size})", sys.executable, size, "peer_kvstate", mine))
        rows.append((f"kvstate, SGLang API (page {size})", sys.executable, size,
                     "peer_kvstate_sglang", mine))
        if before:
            old = dict(os.environ, PYTHONPATH=f"{before}:{before}/tools:{PEERS_DIR}")
            rows.append((f"kvstate before, planner (page {size})", sys.executable, size,
                         "peer_kvstate", old))
    if (peers_home / "venv-vllm/bin/python").exists():
        rows.append(("vLLM 0.33 (block 16)", str(peers_home / "venv-vllm/bin/python"), 16,
                     "peer_vllm", dict(os.environ, PYTHONPATH=str(PEERS_DIR))))
    sglang = peers_home / "venv-sglang/bin/python"
    if sglang.exists():
        env = dict(os.environ, PYTHONPATH=str(PEERS_DIR))
        rows += [("SGLang 0.5.23 RadixCache (page 16)", str(sglang), 16, "peer_sglang", env),
                 ("SGLang 0.5.23 RadixCache (page 1)", str(sglang), 1, "peer_sglang", env),
                 ("SGLang 0.5.23 UnifiedRadixCache (page 1)", str(sglang), 1,
                  "peer_sglang_unified", env)]
    return rows


def peers_table(requests: int, repeats: int, before: str | None, clock: str = "cpu"
                ) -> list[dict[str, object]]:
    extra = ["--requests", str(requests), "--seed", "0", "--capacity", "60000"]
    samples: dict[str, list[dict[str, float]]] = {}
    plan = configs(before)
    for _ in range(repeats):  # interleaved, so drifting load hits every peer alike
        for label, python, size, peer, env in plan:
            try:
                samples.setdefault(label, []).append(run_sim(python, peer, size, extra, env, clock))
            except subprocess.CalledProcessError as exc:
                print(f"{label}: failed: {exc.stderr.decode()[-400:]}", file=sys.stderr)
    rows: list[dict[str, object]] = []
    for label, runs in samples.items():
        row: dict[str, object] = {"peer": label, "runs": len(runs)}
        for metric in METRICS:
            row[metric] = statistics.median(run[metric] for run in runs)
        row["hit_rate_tokens"] = runs[0]["hit_rate_tokens"]
        row["evicted_tokens"] = runs[0]["evicted_tokens"]
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--skip-peers", action="store_true")
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", default=None, help="a checkout of the kvstate to compare with")
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks-core.md"))
    parser.add_argument("--tune-gc", action="store_true", help="call kvstate.tune_gc() first")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="time the peers' phases in CPU time of the driver thread (default) "
                             "or wall time")
    args = parser.parse_args(argv)
    if args.tune_gc:
        from kvstate import tune_gc

        tune_gc()
    lines: list[str] = []
    if not args.skip_scaling:
        table: dict[int, dict[str, float]] = {}
        for num_pages in (int(s) for s in args.sizes.split(",")):
            table[num_pages] = scaling(num_pages)
            print(num_pages, table[num_pages], file=sys.stderr)
        labels = list(next(iter(table.values())))
        lines += ["## µs per applied event vs pool size (page size 16, a quarter of the pool "
                  "allocated, a quarter freed back)", "",
                  "| event mix | " + " | ".join(f"{n:,} pages" for n in table) + " |",
                  "|---|" + "---|" * len(table)]
        lines += [f"| {label} | " + " | ".join(f"{table[n][label]:.2f}" for n in table) + " |"
                  for label in labels]
    if not args.skip_peers:
        rows = peers_table(args.requests, args.repeats, args.before, args.clock)
        lines += ["", f"## kvstate vs the peers: same driver, same run, events recorded "
                      f"(synthetic workload, {args.requests} requests, median of {args.repeats}, "
                      f"{args.clock} time)", "",
                  "| peer | µs / decode request-step | µs / admission | µs / finish "
                  "| token hit rate | evicted tokens |", "|---|---|---|---|---|---|"]
        for row in rows:
            lines.append(f"| {row['peer']} | {row['us_per_decode_request_step']:.2f} | "
                         f"{row['us_per_admission']:.0f} | {row['us_per_finish']:.0f} | "
                         f"{row['hit_rate_tokens']:.3f} | {row['evicted_tokens']} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
