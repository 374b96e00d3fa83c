"""Model checking for kvstate: the bounded explorer behind ``kvstate check``.

``run_check(scope, ...)`` explores a named scope (``scopes.SCOPES``) at the
event level (every legal fact event: policy-free safety) or the planner level
(every request a user could make), checks the properties in
``specs.invariants`` plus agreement with the spec model ``specs.model``, and
returns a ``Report``; on a violation it writes the shortest counterexample as
a replayable msgpack log.  ``specs`` is the repository's top-level spec
package; it must be importable (run from the repository root).  A planner-level
run takes an ``EvictionPolicy`` (``kvstate.planner.policy``) and checks it too
(``planner_level``, ``policy_props``).
"""

from __future__ import annotations

import pathlib
from typing import Any

from kvstate.checking.explorer import ProgressHook, Report, Violation, explore, random_walks
from kvstate.checking.levels import EventLevel
from kvstate.checking.planner_level import PlannerLevel
from kvstate.checking.scopes import SCOPES, Scope

__all__ = ["SCOPES", "EventLevel", "PlannerLevel", "Report", "Scope", "Violation",
           "explore", "make_level", "random_walks", "run_check"]


def make_level(scope: Scope, policy: Any = None, *, check_model: bool = True,
               symmetry: bool | None = None) -> Any:
    if scope.level == "vllm":
        if policy is not None:
            raise ValueError("the vLLM level explores vLLM's own policy; --policy does not apply")
        from kvstate.vllm.explore import VllmLevel

        return VllmLevel(scope)
    if scope.level == "event":
        if policy is not None:
            raise ValueError("a policy applies to planner-level scopes only")
        return EventLevel(scope, check_model=check_model, symmetry=symmetry)
    return PlannerLevel(scope, policy, check_model=check_model)


def run_check(scope: Scope | str, *, policy: Any = None, max_depth: int | None = None,
              state_limit: int | None = None, walks: int = 0, walk_depth: int = 50,
              seed: int = 0, check_model: bool = True, symmetry: bool | None = None,
              log_dir: str | pathlib.Path | None = "replay/failures", workers: int = 1,
              progress: ProgressHook | None = None) -> Report:
    """Explore ``scope`` (BFS, or ``walks`` random walks); write a log on a violation.

    ``workers`` > 1 runs the BFS on that many processes (``checking.parallel``):
    the same unique states, edges and depth for a complete run.  ``progress``,
    if given, is called with (unique states, depth, edges) as the search goes.
    """
    resolved = SCOPES[scope] if isinstance(scope, str) else scope
    level = make_level(resolved, policy, check_model=check_model, symmetry=symmetry)
    # The SOMETIMES probes describe radix-tree behaviour; the vLLM level has its own edge checks.
    probes: tuple[str, ...] | None = () if resolved.level == "vllm" else None
    if walks:
        report = random_walks(level, walks=walks, depth=walk_depth, seed=seed, probes=probes,
                              progress=progress)
    elif workers > 1:
        from kvstate.checking.parallel import explore_parallel

        report = explore_parallel(level, workers=workers, max_depth=max_depth,
                                  state_limit=state_limit, probes=probes, progress=progress)
    else:
        report = explore(level, max_depth=max_depth, state_limit=state_limit, probes=probes,
                         progress=progress)
    if report.violation is not None and log_dir is not None:
        from kvstate.checking.counterexample import write_log

        name = "-".join(report.violation.names)
        path = pathlib.Path(log_dir) / f"explore-{name}-{resolved.name}.msgpack"
        initial = level.state(level.initial())  # block mode for the vLLM level
        host_pages = 0 if initial.host is None else initial.host.num_pages
        swa_pages = 0 if initial.swa is None else initial.swa.num_pages
        mamba_slots = 0 if initial.mamba is None else initial.mamba.num_slots
        report.log_path = str(write_log(path, initial.geometry, report.violation,
                                        host_pages=host_pages, swa_pages=swa_pages,
                                        mamba_slots=mamba_slots))
    return report
