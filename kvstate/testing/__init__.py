"""Testing tools shipped with kvstate, for your own policies and integrations.

* ``strategies``: hypothesis strategies for token sequences, page-boundary
  lengths, machine scopes and request workloads.
* ``SpecMachine``: a hypothesis ``RuleBasedStateMachine`` that drives the
  reducer (or your override of ``apply_event``) and the spec model side by side.
* ``check_policy(policy, scope)``: explore a planner-level scope with your
  eviction/placement policy against the spec; raises ``PolicyViolation`` with
  the shortest counterexample, or returns the ``Report``.

These need the repository's ``specs`` package on the import path.
"""

from __future__ import annotations

from typing import Any

from kvstate.checking import SCOPES, Report, Scope, run_check
from kvstate.checking.planner_level import Policy
from kvstate.testing.strategies import (
    MachineScope,
    boundary_lengths,
    machine_scopes,
    token_sequences,
    workloads,
)


class PolicyViolation(AssertionError):
    def __init__(self, report: Report, text: str) -> None:
        super().__init__(text)
        self.report = report


def check_policy(policy: Any, scope: Scope | str = "planner", *, max_depth: int | None = None,
                 log_dir: str | None = "replay/failures") -> Report:
    """Explore ``scope`` (a planner-level scope) with ``policy``; raise on any violation."""
    from kvstate.checking.counterexample import format_violation

    resolved = SCOPES[scope] if isinstance(scope, str) else scope
    if resolved.level != "planner":
        raise ValueError(f"scope {resolved.name!r} is not a planner-level scope")
    report = run_check(resolved, policy=policy, max_depth=max_depth, log_dir=log_dir)
    if report.violation is not None:
        raise PolicyViolation(report, format_violation(report.violation))
    if report.sometimes_missed:
        raise PolicyViolation(report, f"never reached: {', '.join(report.sometimes_missed)}")
    return report


def __getattr__(name: str) -> Any:
    if name == "SpecMachine":  # hypothesis.stateful is only imported when asked for
        from kvstate.testing.machine import SpecMachine

        return SpecMachine
    raise AttributeError(name)


__all__ = ["MachineScope", "Policy", "PolicyViolation", "SpecMachine", "boundary_lengths",
           "check_policy", "machine_scopes", "token_sequences", "workloads"]
