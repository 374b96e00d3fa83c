"""Differential check: kvstate's Mamba hybrids vs the real SGLang 0.5.23 (both tree cores).

    python tools/diff_sglang_mamba.py --seeds 40 --steps 150
    python tools/diff_sglang_mamba.py --configs mamba-extra --page-sizes 4 --seeds 5
    python tools/diff_sglang_mamba.py --directed            # the worked examples only

Configurations (``--configs``): ``mamba-nobuf`` (FULL + MAMBA, no_buffer,
page 1 only, as 0.5.23 requires), ``mamba-extra`` (FULL + MAMBA,
extra_buffer), ``swa-mamba-nobuf`` and ``swa-mamba-extra`` (FULL + SWA +
MAMBA).  A seeded generator writes one op list per seed (``generate``):
bare tree calls (insert of fresh slots with a fresh state, match, match +
lock, unlock with or without ``release_swa``, FULL / SWA / Mamba /
for-allocation eviction) and request flows in 0.5.23's scheduler order
(admit with copy-on-match + prefill checkpoint, chunked prefill with a
checkpoint per chunk, decode steps with the tracked checkpoints of the extra
buffer, finish, abort).  Seeds below 0 are
directed scripts: hybrid.md's worked examples.  The Mamba chunk, the track
interval, the SWA window and the pool sizes vary by seed and are small, so
branch points, donations, copies and every kind of eviction happen.

Each side (``tools/mamba_sides.py``) runs in its own interpreter: SGLang in
the peer venv (``$PEERS/venv-sglang``, default ``~/kvstate-peers``) with its
Python tree core and its default Rust core, kvstate in this one.  After
every op both report the op's result and a snapshot (free lists in order,
the FULL -> SWA mapping, the six sizes, each running request's row, cursors,
Mamba slots, tracked lengths and mapping entries; against the Python core
also every node's slots and locks and both auxiliary LRUs).  The driver
prints the first divergence per seed and a summary line.  Not a CI
dependency.
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
sys.path.insert(0, str(HERE))
from diff_sglang_hybrid import first_divergence  # noqa: E402

FULL_PAGES, SWA_PAGES, ROWS, WIDTH = 40, 28, 4, 256
CONFIGS = {  # name: (SWA pool, extra buffer, page sizes)
    "mamba-nobuf": (False, False, (1,)),
    "mamba-extra": (False, True, (1, 4)),
    "swa-mamba-nobuf": (True, False, (1,)),
    "swa-mamba-extra": (True, True, (1, 4)),
}
KINDS = ["insert", "insert", "insert", "match", "lock", "unlock", "release_swa", "evict",
         "evict_swa", "evict_mamba", "evict_alloc", "admit", "admit", "admit", "decode", "decode",
         "decode", "decode", "finish", "finish", "abort", "admit_done", "admit_chunked"]


def settings(config: str, seed: int, page_size: int) -> dict[str, Any]:
    """The pool sizes, window, chunk and intervals of one seed."""
    swa, extra, _ = CONFIGS[config]
    rng = random.Random(f"{config}/{seed}/{page_size}")
    if seed < 0:
        return {"config": config, "page": page_size, "window": 4 if swa else None,
                "chunk": 8, "track_interval": 256, "interval": 1,
                "mamba_slots": 10, "full_pages": 96 // page_size, "swa_pages": 64 // page_size}
    return {"config": config, "page": page_size,
            "window": rng.choice([1, page_size, 2 * page_size + 1, 3 * page_size + 2]) if swa
            else None,
            "chunk": rng.choice([2, 4, 8]), "track_interval": rng.choice([4, 8, 16, 256]),
            "interval": rng.choice([1, 1, 2, 128]),
            # enough that a checkpoint always finds a slot (0.5.23 asserts otherwise): three
            # running requests' slots and locked hits, a fork, two bare locks
            "mamba_slots": rng.choice([16, 18, 22] if extra else [9, 10, 12]),
            "full_pages": FULL_PAGES, "swa_pages": SWA_PAGES}


def generate(config: str, seed: int, steps: int, page_size: int) -> tuple[dict[str, Any],
                                                                         list[list[Any]]]:
    """``(settings, ops)`` for a seed (below 0: a directed script)."""
    setup = settings(config, seed, page_size)
    if seed < 0:
        return setup, _directed(-seed)
    rng = random.Random(seed * 1000 + page_size + 7 * len(config))
    vocab = rng.choice([2, 3])
    kinds = [k for k in KINDS if setup["window"] is not None or k not in ("evict_swa",
                                                                          "release_swa")]
    ops: list[list[Any]] = []

    def tokens(low: int, high: int) -> list[int]:
        return [rng.randint(1, vocab) for _ in range(rng.randint(low, high))]

    for _ in range(steps):
        kind = rng.choice(kinds)
        if kind == "insert":
            ops.append([kind, [rng.randint(1, vocab) for _ in range(rng.randint(1, 6) * page_size)]])
        elif kind in ("match", "lock"):
            ops.append([kind, tokens(page_size, 8 * page_size)])
        elif kind in ("unlock", "release_swa"):
            ops.append([kind, [rng.random(), rng.random()]])
        elif kind in ("evict", "evict_swa"):
            ops.append([kind, rng.randint(1, 8) * page_size])
        elif kind == "evict_mamba":
            ops.append([kind, rng.randint(1, 3)])
        elif kind == "evict_alloc":
            swa_tokens = rng.randint(0, 6) * page_size if setup["window"] is not None else 0
            ops.append([kind, [rng.randint(0, 6) * page_size, swa_tokens, rng.randint(0, 3)]])
        elif kind in ("admit", "admit_done"):
            ops.append([kind, [tokens(2, 12 * page_size), rng.randint(1, vocab)]])
        elif kind == "admit_chunked":
            ops.append([kind, [tokens(2, 16 * page_size), rng.randint(1, vocab),
                               rng.randint(1, 4) * page_size]])
        elif kind == "decode":
            ops.append([kind, rng.randint(1, vocab)])
        else:
            ops.append([kind, rng.random()])
    return setup, ops


def _directed(number: int) -> list[list[Any]]:
    """1: hybrid.md's Mamba walkthrough (sg_mamba_demo.py: copy-on-match, the branch point,
    the Mamba and FULL evictions); 2: a prompt shared by two requests, then decoded past
    the track grid."""
    if number == 1:
        prompt = list(range(100, 120))
        return [["admit", [prompt, 900]], ["decode", 901], ["decode", 902], ["decode", 903],
                ["finish", 0.0], ["match", prompt + [900, 901, 555]],
                ["admit_done", [prompt + [900, 901, 555], 1]],
                ["match", prompt[:10] + [1, 2, 3, 4, 5, 6]],
                ["admit_done", [prompt[:10] + [1, 2, 3, 4, 5, 6], 2]],
                ["finish", 0.0], ["finish", 0.0],
                ["match", prompt[:10] + [1, 2, 3, 4, 5, 6, 9]], ["evict_mamba", 1],
                ["evict", 4]]
    prompt = list(range(1, 25))
    return ([["admit", [prompt, 50]], ["admit", [prompt[:16] + [7, 7, 7, 7], 51]]]
            + [["decode", 60 + k] for k in range(12)]
            + [["finish", 0.0], ["match", prompt + [50]], ["abort", 0.0], ["evict_mamba", 2],
               ["evict_alloc", [8, 0, 2]]])


def run_side(python: str, kind: str, backend: str, config: str, page_size: int,
             seeds: list[int], steps: int) -> dict[int, Any]:
    command = [python, str(HERE / "mamba_sides.py"), kind, backend, config, str(page_size),
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--page-sizes", default="1,4")
    parser.add_argument("--backends", default="python,rust")
    parser.add_argument("--directed", action="store_true", help="only the directed scripts")
    args = parser.parse_args(argv)
    peers = Path(os.environ.get("PEERS", Path.home() / "kvstate-peers"))
    sglang_python = str(peers / "venv-sglang" / "bin" / "python")
    pages = [int(p) for p in args.page_sizes.split(",")]
    bad = total = 0
    for config in args.configs.split(","):
        for page_size in [p for p in pages if p in CONFIGS[config][2]]:
            directed = [-1, -2]
            first = args.first_seed
            seeds = directed if args.directed else [*directed, *range(first, first + args.seeds)]
            ours = run_side(sys.executable, "kvstate", "-", config, page_size, seeds, args.steps)
            for backend in args.backends.split(","):
                theirs = run_side(sglang_python, "sglang", backend, config, page_size, seeds,
                                  args.steps)
                for seed in seeds:
                    total += 1
                    mine = ours[seed]
                    if backend == "rust" and not isinstance(mine, str):  # no tree dump
                        mine = [[op, result, snap[:-1]] for op, result, snap in mine]
                    problem = first_divergence(mine, theirs[seed])
                    if problem is not None:
                        bad += 1
                        print(f"{config} page {page_size} {backend} seed {seed}: {problem}",
                              flush=True)
    print(f"{total - bad}/{total} runs identical ({args.seeds} random seeds x {args.steps} ops "
          f"and the directed scripts; configs {args.configs}; page sizes {args.page_sizes}; "
          f"SGLang cores {args.backends})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
