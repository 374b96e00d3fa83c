"""Benchmark the Mamba front end: CPU µs per operation, kvstate vs SGLang 0.5.23, in one run.

    python tools/bench_mamba.py                      # every configuration, 3 repeats
    python tools/bench_mamba.py --configs mamba-extra --steps 3000 --repeats 5

Each side (kvstate here, SGLang in the peer venv with its Python and its
Rust tree core) replays the same op list: ``tools/diff_sglang_mamba.py``'s
generator for one seed, with the differential's pools, so admissions hit,
copy and evict as they do there.  Ops run through ``tools/mamba_ops.py``,
the same calls the differential compares (SGLang's own scheduler functions
on its side).  Each op is timed with ``time.process_time`` (CPU time, not
wall time: the machine is shared), with no snapshot and no check, and
summed per op kind.  The sides run interleaved, ``--repeats`` times each, in
fresh processes; the table reports the median µs per op of each kind.
Ratios are only comparable inside one run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from diff_sglang_mamba import CONFIGS, generate  # noqa: E402

KINDS = ("admit", "admit_chunked", "decode", "finish", "match", "insert", "evict_alloc")


def time_side(kind: str, backend: str, config: str, page_size: int, seed: int,
              steps: int) -> dict[str, list[float]]:
    """CPU seconds and counts per op kind for one replay of the op list."""
    from mamba_ops import apply_op
    from mamba_sides import Side

    setup, ops = generate(config, seed, steps, page_size)
    side = Side(kind, backend, setup)
    totals: dict[str, list[float]] = {}
    gc.collect()
    for op in ops:
        start = time.process_time()
        result = apply_op(side, op)
        spent = time.process_time() - start
        if isinstance(result, str):  # "skip", "none", "full", "oom": not a real op
            continue
        entry = totals.setdefault(op[0], [0.0, 0])
        entry[0] += spent
        entry[1] += 1
    return totals


def run_side(python: str, kind: str, backend: str, config: str, page_size: int, seed: int,
             steps: int) -> dict[str, list[float]]:
    command = [python, str(HERE / "bench_mamba.py"), "--side", kind, backend, config,
               str(page_size), str(seed), str(steps)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--side":
        kind, backend, config, page, seed, steps = sys.argv[2:8]
        totals = time_side(kind, backend, config, int(page), int(seed), int(steps))
        print(json.dumps(totals))
        return 0
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--configs", default="mamba-nobuf,mamba-extra,swa-mamba-extra")
    parser.add_argument("--page-size", type=int, default=1)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backends", default="python,rust")
    args = parser.parse_args(argv)
    peers = Path(os.environ.get("PEERS", Path.home() / "kvstate-peers"))
    sglang = str(peers / "venv-sglang" / "bin" / "python")
    sides = [("kvstate", sys.executable, "kvstate", "-")] + [
        (f"SGLang ({b} core)", sglang, "sglang", b) for b in args.backends.split(",")]
    print("| configuration | op | count | " + " | ".join(f"{name} µs" for name, *_ in sides)
          + " | SGLang (rust) / kvstate |")
    print("|---|---|---:|" + "---:|" * len(sides) + "---:|")
    for config in args.configs.split(","):
        page = args.page_size if args.page_size in CONFIGS[config][2] else 1
        samples: dict[str, dict[str, list[float]]] = {name: {} for name, *_ in sides}
        counts: dict[str, float] = {}
        for _ in range(args.repeats):
            for name, python, kind, backend in sides:
                totals = run_side(python, kind, backend, config, page, args.seed, args.steps)
                for op, (seconds, count) in totals.items():
                    samples[name].setdefault(op, []).append(1e6 * seconds / max(count, 1))
                    counts[op] = count
        for op in KINDS:
            if op not in counts:
                continue
            medians = [statistics.median(samples[name].get(op, [float("nan")]))
                       for name, *_ in sides]
            ratio = medians[-1] / medians[0] if medians[0] else float("nan")
            print(f"| {config} (page {page}) | {op} | {int(counts[op])} | "
                  + " | ".join(f"{value:.0f}" for value in medians) + f" | {ratio:.1f}x |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
