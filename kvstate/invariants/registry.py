"""The registry of named invariants: ``CHECKS`` and the ``Violation`` they report.

Names are stable: logs, the explorer, replay failures and ``specs/SPEC.md``
refer to them.  A check is ``fn(state) -> Iterator[str]`` (one message per
violation found).  Registered at import time only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import attrs


@attrs.frozen
class Violation:
    """One invariant violation: the check's name and what it found."""

    check: str
    message: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.message}"


Check = Callable[[Any], Iterator[str]]
CHECKS: dict[str, Check] = {}
HOST_NAMES: set[str] = set()  # checks that need a host tier (skipped on a state without one)


def named(name: str, *, host: bool = False) -> Callable[[Check], Check]:
    """Register ``fn`` as the check called ``name``."""

    def register(fn: Check) -> Check:
        if name in CHECKS:
            raise ValueError(f"check {name!r} is already registered")
        CHECKS[name] = fn
        if host:
            HOST_NAMES.add(name)
        return fn

    return register


def run_checks(state: Any, names: tuple[str, ...] | None = None,
               table: dict[str, Check] | None = None) -> list[Violation]:
    """Run the named checks (all that apply by default); every violation found, in order."""
    table = CHECKS if table is None else table
    if names is None:
        has_host = getattr(state, "host", None) is not None
        names = tuple(n for n in table if has_host or n not in HOST_NAMES)
    return [Violation(name, message) for name in names for message in table[name](state)]
