"""Testing tools shipped with kvstate, for your own policies and integrations.

* ``strategies``: hypothesis strategies for token sequences, page-boundary
  lengths, machine scopes and request workloads.
* ``SpecMachine``: a hypothesis ``RuleBasedStateMachine`` that drives the
  persistent backend (or your override of ``apply_event``), a live backend
  and the spec model side by side; ``BlockSpecMachine`` and
  ``HostSpecMachine`` do the same in vLLM's block mode and with a host tier.
* ``check_policy(policy, scope)``: explore a planner-level scope with your
  ``EvictionPolicy`` (``kvstate.planner.policy``) against the spec and the
  policy rules (``victims_evictable``, ``victims_enough``, ``victims_minimal``,
  ``policy_deterministic``); raises ``PolicyViolation`` with the shortest
  counterexample, or returns the ``Report``.
* ``example_policies``: policies that break each rule, and safe ones that
  merely cache worse (``kvstate check --compare`` shows those).

These need the repository's ``specs`` package on the import path.
"""

from __future__ import annotations

from typing import Any

from kvstate.checking import SCOPES, Report, Scope, run_check
from kvstate.planner.policy import EvictionPolicy, LeafPolicy, load_policy, require_policy
from kvstate.testing.strategies import (
    MachineScope,
    boundary_lengths,
    machine_scopes,
    token_sequences,
    workloads,
)


class PolicyViolation(AssertionError):
    """A policy (or the planner with it) broke a property; ``report.violation`` names it."""

    def __init__(self, report: Report, text: str) -> None:
        super().__init__(text)
        self.report = report


def check_policy(policy: EvictionPolicy | str, scope: Scope | str = "planner", *,
                 max_depth: int | None = None, log_dir: str | None = "replay/failures") -> Report:
    """Explore ``scope`` (a planner-level scope) with ``policy``; raise on any violation.

    ``policy`` is a policy object or a name for ``load_policy`` (``lru``,
    ``module:Class``); one without the protocol raises ``PolicyError``.
    """
    from kvstate.checking.counterexample import format_violation

    policy = load_policy(policy) if isinstance(policy, str) else require_policy(policy)

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
    # hypothesis.stateful is only imported when a machine is asked for
    if name == "SpecMachine":
        from kvstate.testing.machine import SpecMachine

        return SpecMachine
    if name in ("BlockSpecMachine", "HostSpecMachine"):
        from kvstate.testing import machines

        return getattr(machines, name)
    raise AttributeError(name)


__all__ = ["BlockSpecMachine", "EvictionPolicy", "HostSpecMachine", "LeafPolicy", "MachineScope",
           "PolicyViolation", "SpecMachine", "boundary_lengths", "check_policy", "machine_scopes",
           "token_sequences", "workloads"]
