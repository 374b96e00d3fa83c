"""``kvstate check``: explore a named scope and check every spec property.

    kvstate check --list-scopes
    kvstate check --scope tiny [--json]
    kvstate check --scope planner --policy mypkg.policies:MyPolicy
    kvstate check --policy mypkg.policies:MyPolicy --compare lru --trace TRACE [--capacity CAP]
    kvstate check --scope core6 --walks 200 --walk-depth 40 --seed 7

``--policy`` takes the names ``kvstate simulate --policy`` takes (``lru``,
``fifo``, ``lfu`` or ``module:Class``, imported from the current directory),
loaded by the one loader ``kvstate.planner.policy.load_policy``.  At a
planner-level scope the policy's answers are checked too (``victims_evictable``,
``victims_enough``, ``victims_minimal``, ``policy_deterministic``).
``--compare`` runs the policy and the named one through the simulator on
``--trace`` and prints both hit rates (``kvstate.checking.compare``).

Exits 0 when no property is violated and every SOMETIMES probe was hit, 1
otherwise (a violation also writes its counterexample under ``--log-dir``),
2 on a usage error, including a policy that cannot be loaded.  Progress
(unique states, depth, rate; ETA with --max-states or --walks) is shown on
a terminal, and as a plain line every few seconds with --progress
elsewhere; a scope known to take minutes on one process gets a one-line
warning naming --workers.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from kvstate.commands._advice import check_advice, warn
from kvstate.commands._progress import Progress, add_progress_option, progress_mode
from kvstate.planner.policy import PolicyError, load_policy
from kvstate.simulate.policies import VLLM_POLICY

if TYPE_CHECKING:
    from kvstate.checking.compare import ComparePoint


def _ensure_specs_importable() -> None:
    """``specs`` lives next to the ``kvstate`` package in the repository."""
    try:
        import specs  # noqa: F401
    except ImportError:
        import kvstate

        root = pathlib.Path(kvstate.__file__).resolve().parents[1]
        if (root / "specs").is_dir():
            sys.path.insert(0, str(root))


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "check", help="model-check the core in a bounded scope",
        description="Breadth-first exhaustive exploration (or random walks) of a named scope, "
                    "checking ALWAYS, TRANSITIONS and SOMETIMES properties and agreement with "
                    "the spec model.")
    parser.add_argument("--scope", help="scope name (see --list-scopes)")
    parser.add_argument("--list-scopes", action="store_true", help="list the scopes and exit")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--policy", metavar="NAME",
                        help="eviction policy to check: lru, fifo, lfu or module:Class "
                             "(planner-level scopes; the same names as simulate --policy)")
    parser.add_argument("--compare", metavar="NAME",
                        help="also report --policy's hit rate against this policy on --trace "
                             "(a --policy name, or vllm: vLLM's free-queue LRU)")
    parser.add_argument("--trace", metavar="TRACE",
                        help="trace for --compare (any format kvstate simulate reads)")
    parser.add_argument("--capacity", action="append", metavar="CAP",
                        help="--compare capacities, as simulate --capacity (default: a tenth "
                             "of the pages the trace would occupy)")
    parser.add_argument("--limit", type=int, metavar="N",
                        help="--compare: use only the first N requests of the trace")
    parser.add_argument("--depth", type=int, help="depth bound (default: the scope's)")
    parser.add_argument("--max-states", type=int, help="stop after this many unique states")
    parser.add_argument("--walks", type=int, default=0, help="random walks instead of BFS")
    parser.add_argument("--walk-depth", type=int, default=50, help="steps per random walk")
    parser.add_argument("--seed", type=int, default=0, help="random-walk seed")
    parser.add_argument("--no-model", action="store_true",
                        help="skip the spec-model agreement check (faster)")
    parser.add_argument("--no-symmetry", action="store_true", help="fingerprint states as they are")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="breadth-first search on N processes (same states, edges and depth; "
                             "default 1)")
    parser.add_argument("--log-dir", default="replay/failures",
                        help="where counterexample logs go (default replay/failures)")
    add_progress_option(parser)
    parser.set_defaults(func=run)


@contextmanager
def _search_progress(args: argparse.Namespace, scope_depth: int) -> Iterator[tuple[Progress, Any]]:
    """The progress of one search and the ``run_check`` hook that feeds it.

    Breadth-first search counts unique states (out of ``--max-states`` when
    given, which makes an ETA); random walks count walks (out of ``--walks``).
    """
    mode = progress_mode(args.progress)
    bound = scope_depth if args.depth is None else args.depth
    if args.walks:
        bar = Progress(f"check {args.scope}", total=args.walks, unit="walks", mode=mode)
        walked = [0]

        def hook(states: int, depth: int, edges: int) -> None:
            walked[0] += 1
            bar.update(walked[0], f"{states:,} states, depth {depth}")
    else:
        bar = Progress(f"check {args.scope}", total=args.max_states, unit="states", mode=mode,
                       unit_scale=True)

        def hook(states: int, depth: int, edges: int) -> None:
            bar.update(states, f"depth {depth}/{bound}, {edges:,} edges")
    with bar:
        yield bar, hook


@contextmanager
def _quiet_workers() -> Iterator[None]:
    """Ctrl-C reaches the whole process group: ``--workers`` children leave without a traceback.

    The forked search workers inherit this handler; in them it exits at
    once (they hold nothing to clean up), and the parent raises
    ``KeyboardInterrupt`` as usual, which ``kvstate.cli`` reports in one line.
    """
    parent = os.getpid()

    def on_interrupt(signum: int, frame: Any) -> None:
        if os.getpid() != parent:
            os._exit(130)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run(args: argparse.Namespace) -> int:
    _ensure_specs_importable()
    from kvstate.checking import SCOPES, run_check
    from kvstate.checking.counterexample import format_violation

    if args.list_scopes:
        for name, scope in SCOPES.items():
            print(f"{name:14s} {scope.level:8s} pages={scope.num_pages} P={scope.page_size} "
                  f"rows={scope.num_rows} vocab={scope.vocab} depth={scope.max_depth}  "
                  f"{scope.description}")
        return 0
    if (args.compare is None) != (args.trace is None):
        return _usage("--compare and --trace go together")
    if not args.scope and args.compare is None:
        return _usage("--scope NAME is required (or --list-scopes, or --compare with --trace)")
    if args.scope and args.scope not in SCOPES:
        return _usage(f"unknown scope {args.scope!r}; try --list-scopes")
    if args.workers < 1:
        return _usage("--workers must be >= 1")
    if args.scope and args.policy and SCOPES[args.scope].level != "planner":
        return _usage(f"--policy applies to planner-level scopes; {args.scope!r} is "
                      f"{SCOPES[args.scope].level}-level")
    try:  # both names load before anything runs: a bad class is one line and exit 2
        policy = load_policy(args.policy) if args.policy else None
        if args.compare not in (None, VLLM_POLICY):  # simulate's vLLM pool is a baseline too
            load_policy(args.compare)
    except PolicyError as error:
        return _usage(str(error))
    compared: list[dict[str, Any]] = []
    if args.compare is not None:
        try:
            points = _compare(args)
        except (ValueError, OSError) as error:  # a bad capacity or trace file
            return _usage(str(error))
        compared = [point.as_json() for point in points]
        if not args.json:
            for point in points:
                print(point.line())
    if not args.scope:
        if args.json:
            print(json.dumps({"compare": compared}))
        return 0
    for message in check_advice(args.scope, args.workers, args.walks, args.max_states):
        warn("check", message)
    with _search_progress(args, SCOPES[args.scope].max_depth) as (bar, hook), _quiet_workers():
        report = run_check(args.scope, policy=policy, max_depth=args.depth,
                           state_limit=args.max_states, walks=args.walks,
                           walk_depth=args.walk_depth, seed=args.seed,
                           check_model=not args.no_model,
                           symmetry=False if args.no_symmetry else None, log_dir=args.log_dir,
                           workers=args.workers, progress=hook if bar.mode != "off" else None)
    if args.json:
        print(json.dumps({**report.as_json(), **({"compare": compared} if compared else {})}))
    else:
        print(f"scope {report.scope} ({report.level} level, {report.mode}): "
              f"{report.unique_states} unique states, {report.edges} edges, depth "
              f"{report.max_depth}, {report.seconds:.2f} s, {report.states_per_second:.0f} states/s")
        print(f"sometimes hit: {', '.join(sorted(report.sometimes_hit)) or '-'}")
        if report.sometimes_missed:
            print(f"SOMETIMES NEVER HIT: {', '.join(report.sometimes_missed)}")
        if report.violation is not None:
            print(format_violation(report.violation))
            if report.log_path:
                print(f"counterexample log: {report.log_path}")
    return 0 if report.ok else 1


def _usage(message: str) -> int:
    print(f"kvstate check: {message}", file=sys.stderr)
    return 2


def _compare(args: argparse.Namespace) -> list[ComparePoint]:
    """``--compare``: the policy and the named baseline on ``--trace`` (``checking.compare``)."""
    from kvstate.checking.compare import compare_on_trace
    from kvstate.commands.simulate import parse_capacity

    capacities = [parse_capacity(part) for value in args.capacity or []
                  for part in value.split(",") if part.strip()]
    if not pathlib.Path(args.trace).exists():
        raise ValueError(f"no such trace: {args.trace}")
    return compare_on_trace(args.policy or "lru", args.compare, args.trace, capacities,
                            limit=args.limit)
