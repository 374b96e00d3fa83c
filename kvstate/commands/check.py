"""``kvstate check``: explore a named scope and check every spec property.

    kvstate check --list-scopes
    kvstate check --scope tiny [--json]
    kvstate check --scope planner --policy mypkg.policies:MyPolicy
    kvstate check --scope core6 --walks 200 --walk-depth 40 --seed 7

Exits 0 when no property is violated and every SOMETIMES probe was hit, 1
otherwise (a violation also writes its counterexample under ``--log-dir``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import sys
from typing import Any


def _ensure_specs_importable() -> None:
    """``specs`` lives next to the ``kvstate`` package in the repository."""
    try:
        import specs  # noqa: F401
    except ImportError:
        import kvstate

        root = pathlib.Path(kvstate.__file__).resolve().parents[1]
        if (root / "specs").is_dir():
            sys.path.insert(0, str(root))


def load_policy(spec: str) -> Any:
    """Instantiate ``module:Class`` (no arguments)."""
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"--policy must look like module:Class, got {spec!r}")
    sys.path.insert(0, str(pathlib.Path.cwd()))
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls()


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "check", help="model-check the core in a bounded scope",
        description="Breadth-first exhaustive exploration (or random walks) of a named scope, "
                    "checking ALWAYS, TRANSITIONS and SOMETIMES properties and agreement with "
                    "the spec model.")
    parser.add_argument("--scope", help="scope name (see --list-scopes)")
    parser.add_argument("--list-scopes", action="store_true", help="list the scopes and exit")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--policy", help="planner-level policy to check, as module:Class")
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
    parser.set_defaults(func=run)


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
    if not args.scope:
        print("kvstate check: --scope NAME is required (or --list-scopes)", file=sys.stderr)
        return 2
    if args.scope not in SCOPES:
        print(f"kvstate check: unknown scope {args.scope!r}; try --list-scopes", file=sys.stderr)
        return 2
    if args.workers < 1:
        print("kvstate check: --workers must be >= 1", file=sys.stderr)
        return 2
    policy = load_policy(args.policy) if args.policy else None
    report = run_check(args.scope, policy=policy, max_depth=args.depth,
                       state_limit=args.max_states, walks=args.walks,
                       walk_depth=args.walk_depth, seed=args.seed,
                       check_model=not args.no_model,
                       symmetry=False if args.no_symmetry else None, log_dir=args.log_dir,
                       workers=args.workers)
    if args.json:
        print(json.dumps(report.as_json()))
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
