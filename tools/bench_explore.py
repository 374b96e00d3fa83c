"""Explorer throughput: ``python -m tools.bench_explore [--scopes a,b] [--depth N] [--workers N]``.

Runs each scope with and without the spec-model check, and prints one
markdown row per run: unique states, edges, wall and CPU seconds, states per
wall second and per CPU second (CPU time is the number to compare on a
shared machine; ``--repeat`` keeps the best of several runs).
``--profile`` instead runs one scope once under cProfile (one process) and
prints the functions that take the most time.
"""

from __future__ import annotations

import argparse
import sys

from kvstate.checking import run_check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_explore")
    parser.add_argument("--scopes", default="tiny,paged,tree,core6,planner")
    parser.add_argument("--depth", type=int, default=None)
    parser.add_argument("--workers", type=int, default=1, help="BFS processes (kvstate check --workers)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per row; the best is shown")
    parser.add_argument("--profile", action="store_true", help="cProfile the first scope instead")
    args = parser.parse_args(argv)
    if args.profile:
        return _profile(args.scopes.split(",")[0], args.depth)
    print(f"workers: {args.workers}; CPU s includes the worker processes")
    print("| scope | model | states | edges | wall s | CPU s | states/s (wall) | states/CPU-s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.scopes.split(","):
        for model in (True, False):
            runs = [run_check(name, max_depth=args.depth, check_model=model, log_dir=None,
                              workers=args.workers) for _ in range(max(1, args.repeat))]
            report = min(runs, key=lambda r: r.cpu_seconds)
            status = "" if report.ok else " (FAILED)"
            rate = report.unique_states / report.cpu_seconds if report.cpu_seconds else 0.0
            print(f"| {name}{status} | {'on' if model else 'off'} | {report.unique_states} | "
                  f"{report.edges} | {report.seconds:.2f} | {report.cpu_seconds:.2f} | "
                  f"{report.states_per_second:.0f} | {rate:.0f} |")
    return 0


def _profile(scope: str, depth: int | None) -> int:
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.runcall(run_check, scope, max_depth=depth, log_dir=None)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
