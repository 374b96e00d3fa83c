"""Differential check: kvstate's FULL + SWA hybrid vs the real SGLang 0.5.23 (both tree cores).

    python tools/diff_sglang_hybrid.py --seeds 40 --steps 150 --page-sizes 1,4
    python tools/diff_sglang_hybrid.py --directed            # the worked examples only

A seeded generator writes one op list per seed (``generate``): bare tree
calls (insert of fresh paired slots, match, match + lock, unlock with or
without ``release_swa``, SWA / FULL / for-allocation eviction) and request
flows in 0.5.23's scheduler order (admit + prefill checkpoint, decode steps
sliding the window every ``interval`` tokens, finish).  Seeds below 0 are
directed scripts: the worked examples of shared/reference/hybrid.md.  The
window, the eviction interval and the keys vary by seed; the pools are
small so that every kind of eviction happens.

Each side (``tools/hybrid_sides.py``) runs in its own interpreter: SGLang in
the peer venv (``$PEERS/venv-sglang``, default ``~/kvstate-peers``) with its
Python tree core and with its default Rust core, kvstate in this one.  After
every op both report the op's result (hits, branching seqlens, insert and
eviction counts, lock receipts, new slots) and a snapshot (both free lists
in order, the slot mapping, the four sizes, each running request's row and
cursors; against the Python core also every node's slots, locks and the SWA
LRU).  The driver prints the first divergence per seed and a summary line.
Not a CI dependency.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FULL_PAGES, SWA_PAGES, ROWS, WIDTH = 40, 24, 4, 256
KINDS = ["insert", "insert", "insert", "match", "lock", "unlock", "release_swa", "evict",
         "evict_swa", "evict_alloc", "admit", "admit", "decode", "decode", "decode", "finish",
         "finish"]


def generate(seed: int, steps: int, page_size: int) -> tuple[int, int, list[list[Any]]]:
    """``(window, interval, ops)`` for a seed (below 0: a directed script)."""
    if seed < 0:
        return _directed(-seed, page_size)
    rng = random.Random(seed * 1000 + page_size)
    window = rng.choice([1, page_size, 2 * page_size + 1, 3 * page_size + 2])
    interval = rng.choice([1, 1, 2, 128])
    vocab = rng.choice([2, 3])
    ops: list[list[Any]] = []

    def tokens(low: int, high: int) -> list[int]:
        return [rng.randint(1, vocab) for _ in range(rng.randint(low, high))]

    for _ in range(steps):
        kind = rng.choice(KINDS)
        if kind == "insert":
            length = rng.randint(1, 6) * page_size  # whole pages: a bare paired allocation
            ops.append([kind, [rng.randint(1, vocab) for _ in range(length)]])
        elif kind in ("match", "lock"):
            ops.append([kind, tokens(page_size, 8 * page_size)])
        elif kind in ("unlock", "release_swa"):
            ops.append([kind, [rng.random(), rng.random()]])
        elif kind in ("evict", "evict_swa"):
            ops.append([kind, rng.randint(1, 8) * page_size])
        elif kind == "evict_alloc":
            ops.append([kind, [rng.randint(0, 6) * page_size, rng.randint(0, 6) * page_size]])
        elif kind == "admit":
            ops.append([kind, [tokens(2, 10 * page_size), rng.randint(1, vocab)]])
        elif kind == "decode":
            ops.append([kind, rng.randint(1, vocab)])
        else:
            ops.append([kind, rng.random()])
    return window, interval, ops


def _directed(number: int, page_size: int) -> tuple[int, int, list[list[Any]]]:
    """1: hybrid.md's request walkthrough (window 4, interval 1); 2: its tombstone, window
    lock and recovery chain (window 4)."""
    if number == 1:
        prompt = list(range(100, 112))
        branch = prompt + [900, 901, 555, 556]
        ops = [["admit", [prompt, 900]]] + [["decode", 901 + k] for k in range(6)] + [
            ["finish", 0.0], ["match", branch], ["match", prompt[:8] + [1, 2, 3, 4]],
            ["admit", [branch, 777]], ["finish", 0.0], ["evict_swa", 4], ["evict", 6]]
        return 4, 1, ops
    chain = [["insert", list(range(1, n + 1))] for n in (2, 4, 6, 10)]
    probes = [["match", q] for q in ([1, 2, 99], [1, 2, 3, 99], [1, 2, 3, 4, 5, 99],
                                     [1, 2, 3, 4, 5, 6, 99], list(range(1, 11)))]
    ops = chain + [["evict_swa", 2]] + probes + [
        ["lock", list(range(1, 11))], ["evict_swa", 2], ["lock", list(range(1, 9))],
        ["release_swa", [0.99, 0.0]], ["unlock", [0.99, 0.9]], ["unlock", [0.0, 0.9]],
        ["insert", [1, 2, 3, 4]]]
    return 4, 1, ops


def run_side(python: str, kind: str, backend: str, page_size: int, seeds: list[int],
             steps: int) -> dict[int, Any]:
    command = [python, str(HERE / "hybrid_sides.py"), kind, backend, str(page_size),
               ",".join(map(str, seeds)), str(steps)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    out: dict[int, Any] = {}
    for line in done.stdout.splitlines():
        if line.startswith("["):
            seed, trace = json.loads(line)
            out[seed] = trace
    for seed in seeds:
        out.setdefault(seed, f"side failed: {done.stderr[-1500:]}")
    return out


def first_divergence(ours: Any, theirs: Any) -> str | None:
    if isinstance(ours, str) or isinstance(theirs, str):
        return ours if isinstance(ours, str) else theirs
    for index, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            part = next((i for i in range(3) if a[i] != b[i]), 2)
            what = ("op", "result", "snapshot")[part]
            return f"op {index} ({a[0]}): {what} differs:\n  kvstate {a[part]}\n  sglang  {b[part]}"
    if len(ours) != len(theirs):
        return f"trace lengths differ: {len(ours)} vs {len(theirs)}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--page-sizes", default="1,4")
    parser.add_argument("--backends", default="python,rust")
    parser.add_argument("--directed", action="store_true", help="only the directed scripts")
    args = parser.parse_args(argv)
    peers = Path(os.environ.get("PEERS", Path.home() / "kvstate-peers"))
    sglang_python = str(peers / "venv-sglang" / "bin" / "python")
    bad = total = 0
    for page_size in [int(p) for p in args.page_sizes.split(",")]:
        directed = [-1, -2] if page_size == 1 else [-1]  # the chain script is page-1 only
        first = args.first_seed
        seeds = directed if args.directed else [*directed, *range(first, first + args.seeds)]
        ours = run_side(sys.executable, "kvstate", "-", page_size, seeds, args.steps)
        for backend in args.backends.split(","):
            theirs = run_side(sglang_python, "sglang", backend, page_size, seeds, args.steps)
            for seed in seeds:
                total += 1
                mine = ours[seed]
                if backend == "rust" and not isinstance(mine, str):  # no tree dump from Rust
                    mine = [[op, result, snap[:5]] for op, result, snap in mine]
                problem = first_divergence(mine, theirs[seed])
                if problem is not None:
                    bad += 1
                    print(f"page {page_size} {backend} seed {seed}: {problem}")
    print(f"{total - bad}/{total} runs identical ({args.seeds} random seeds x {args.steps} ops "
          f"and the directed scripts, page sizes {args.page_sizes}, SGLang cores {args.backends})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
