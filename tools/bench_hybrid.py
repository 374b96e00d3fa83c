"""Benchmark the hybrid front ends: CPU µs per operation, kvstate vs SGLang 0.5.23, in one run.

    python tools/bench_swa.py                                   # FULL + SWA, page 1
    python tools/bench_swa.py --page-size 4 --repeats 5
    python tools/bench_mamba.py --configs mamba-extra --steps 3000
    python tools/bench_mamba.py --configs mamba-extra --parts  # + the calls inside an insert
    python tools/bench_swa.py --before ../kvstate-before        # + an older kvstate tree

Two families share this harness: ``swa`` (FULL + SWA: the op lists of
``tools/diff_sglang_hybrid.py``, run through ``tools/hybrid_sides.py`` /
``hybrid_ops.py``) and ``mamba`` (FULL + MAMBA and FULL + SWA + MAMBA:
``tools/diff_sglang_mamba.py`` through ``mamba_sides.py`` / ``mamba_ops.py``).
Each side (kvstate here, SGLang in the peer venv with its Python and its Rust
tree core, and with ``--before DIR`` the kvstate package found in ``DIR``)
replays the same op list of one seed with the differential's pools, so
admissions hit, slide their windows and evict as they do there, through the
same calls the differential compares (SGLang's own scheduler functions on
its side).  Each op is timed with ``time.process_time`` (CPU time: the
machine is shared), with no snapshot and no check, and summed per op kind;
ops that did nothing ("skip", "none", "full", "oom") are left out.  The sides
run interleaved, ``--repeats`` times each, every run in a fresh process; the
table gives the median µs per op of each kind.  Ratios are only comparable
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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

KINDS = {
    "swa": ("admit", "decode", "finish", "match", "lock", "unlock", "release_swa", "insert",
            "evict", "evict_swa", "evict_alloc"),
    "mamba": ("admit", "admit_done", "admit_chunked", "decode", "finish", "abort", "match",
              "lock", "unlock", "release_swa", "insert", "evict", "evict_swa", "evict_mamba",
              "evict_alloc"),
}
DEFAULT_CONFIGS = {"swa": "swa", "mamba": "mamba-nobuf,mamba-extra,swa-mamba-extra"}


def _swa_run(kind: str, backend: str, config: str, page_size: int, seed: int,
             steps: int) -> tuple[Any, list[Any], Callable[[Any, Any], Any]]:
    from diff_sglang_hybrid import generate
    from hybrid_ops import apply_op
    from hybrid_sides import Side

    window, interval, ops = generate(seed, steps, page_size)
    return Side(kind, backend, page_size, window), ops, lambda s, op: apply_op(s, op, interval)


def _mamba_run(kind: str, backend: str, config: str, page_size: int, seed: int,
               steps: int) -> tuple[Any, list[Any], Callable[[Any, Any], Any]]:
    from diff_sglang_mamba import generate
    from mamba_ops import apply_op
    from mamba_sides import Side

    setup, ops = generate(config, seed, steps, page_size)
    return Side(kind, backend, setup), ops, apply_op


def page_sizes(family: str, config: str) -> tuple[int, ...]:
    if family == "swa":
        return (1, 4)
    from diff_sglang_mamba import CONFIGS

    return tuple(CONFIGS[config][2])


# ``--parts``: the calls a bare ``insert`` op makes, timed on their own (Mamba family)
INSERT_PARTS = (("insert: FULL alloc", "bare_alloc"), ("insert: Mamba alloc", "mamba_alloc"),
                ("insert: tree insert", "insert"))


def time_side(family: str, kind: str, backend: str, config: str, page_size: int, seed: int,
              steps: int, parts: bool = False) -> dict[str, list[float]]:
    """CPU seconds and counts per op kind for one replay of the op list (with ``parts``,
    also per call inside the ``insert`` ops)."""
    build = _swa_run if family == "swa" else _mamba_run
    side, ops, apply = build(kind, backend, config, page_size, seed, steps)
    totals: dict[str, list[float]] = {}
    clock = time.process_time
    current = [""]
    pending: dict[str, float] = {}  # the parts of the op in progress
    if parts and family == "mamba":
        _time_insert_parts(side, pending, current)
    gc.collect()
    for op in ops:
        current[0] = op[0]
        start = clock()
        result = apply(side, op)
        spent = clock() - start
        parts_spent = dict(pending)  # the wrappers hold this dict: emptied in place
        pending.clear()
        if isinstance(result, str):  # "skip", "none", "full", "oom": not a real op (nor its parts)
            continue
        for name, seconds in ((op[0], spent), *parts_spent.items()):
            entry = totals.setdefault(name, [0.0, 0])
            entry[0] += seconds
            entry[1] += 1
    return totals


def _time_insert_parts(side: Any, pending: dict[str, float], current: list[str]) -> None:
    """Wrap the side's FULL alloc, Mamba alloc and tree insert: inside an ``insert`` op each
    call's CPU time goes to ``pending`` until the op is known to have done something."""
    clock = time.process_time
    allocator = side.pool.mamba_allocator
    owners = {"bare_alloc": side, "mamba_alloc": allocator, "insert": side}
    for name, call in INSERT_PARTS:
        owner = owners[call]
        real = getattr(owner, "alloc" if call == "mamba_alloc" else call)

        def timed(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            if current[0] != "insert":
                return _real(*args, **kwargs)
            start = clock()
            try:
                return _real(*args, **kwargs)
            finally:
                pending[_name] = pending.get(_name, 0.0) + clock() - start

        setattr(owner, "alloc" if call == "mamba_alloc" else call, timed)


def run_side(python: str, family: str, kind: str, backend: str, config: str, page_size: int,
             seed: int, steps: int, pythonpath: str | None = None, parts: bool = False
             ) -> dict[str, list[float]]:
    command = [python, str(HERE / "bench_hybrid.py"), "--side", family, kind, backend, config,
               str(page_size), str(seed), str(steps), *(["--parts"] if parts else [])]
    env = dict(os.environ)
    if pythonpath is not None:  # an older kvstate tree first on the path
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None, *, family: str | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--side":
        fam, kind, backend, config, page, seed, steps = sys.argv[2:9]
        if kind == "kvstate":  # say which tree was timed (--before)
            import kvstate

            print(kvstate.__file__, file=sys.stderr)
        totals = time_side(fam, kind, backend, config, int(page), int(seed), int(steps),
                           parts="--parts" in sys.argv[9:])
        print(json.dumps(totals))
        return 0
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    if family is None:
        parser.add_argument("--family", choices=sorted(KINDS), default="swa")
    parser.add_argument("--configs", default=None)
    parser.add_argument("--page-size", type=int, default=1)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backends", default="python,rust")
    parser.add_argument("--before", default=None,
                        help="a directory holding an older kvstate package, timed as one more side")
    parser.add_argument("--parts", action="store_true",
                        help="also time the FULL alloc, Mamba alloc and tree insert inside each "
                             "insert op (Mamba family)")
    args = parser.parse_args(argv)
    family = family or args.family
    configs = args.configs or DEFAULT_CONFIGS[family]
    peers = Path(os.environ.get("PEERS", Path.home() / "kvstate-peers"))
    sglang = str(peers / "venv-sglang" / "bin" / "python")
    sides: list[tuple[str, str, str, str, str | None]] = []
    if args.before:
        sides.append(("kvstate before", sys.executable, "kvstate", "-",
                      str(Path(args.before).resolve())))
    sides.append(("kvstate", sys.executable, "kvstate", "-", None))
    sides += [(f"SGLang {b}", sglang, "sglang", b, None) for b in args.backends.split(",")]
    names = [side[0] for side in sides]
    print("| configuration | op | ops timed | " + " | ".join(f"{n} µs" for n in names)
          + " | kvstate / SGLang python |")
    print("|---|---|---:|" + "---:|" * len(sides) + "---:|")
    for config in configs.split(","):
        page = args.page_size if args.page_size in page_sizes(family, config) else 1
        samples: dict[str, dict[str, list[float]]] = {name: {} for name in names}
        counts: dict[str, float] = {}
        for _ in range(args.repeats):
            for name, python, kind, backend, path in sides:
                totals = run_side(python, family, kind, backend, config, page, args.seed,
                                  args.steps, path, parts=args.parts)
                for op, (seconds, count) in totals.items():
                    samples[name].setdefault(op, []).append(1e6 * seconds / max(count, 1))
                    counts[op] = count
        ours = names.index("kvstate")
        theirs = names.index("SGLang python") if "SGLang python" in names else len(names) - 1
        for op in (*KINDS[family], *(name for name, _ in INSERT_PARTS)):
            if op not in counts:
                continue
            medians = [statistics.median(samples[name].get(op, [float("nan")])) for name in names]
            ratio = medians[ours] / medians[theirs] if medians[theirs] else float("nan")
            print(f"| {config} (page {page}) | {op} | {int(counts[op])} | "
                  + " | ".join(f"{value:.0f}" for value in medians) + f" | {ratio:.2f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
