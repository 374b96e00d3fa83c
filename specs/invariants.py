"""Named properties of the kvstate core, in three registries.

* ``ALWAYS[name](state) -> list[str]``: must hold in every reachable state
  (here: the core's named checks, ``kvstate.invariants.CHECKS``, plus the
  spec's own);
* ``TRANSITIONS[name](before, event, after) -> list[str]``: must hold on every
  edge the rules accept (``specs.transitions``);
* ``SOMETIMES[name](edge) -> bool``: must be witnessed at least once by a
  checking run (``specs.sometimes``).

Every function is pure, takes a frozen ``State`` or a ``LiveState``, and
returns one message per violated fact.  Ids and meanings are listed in
``specs/SPEC.md``.  ``check_state`` and ``check_edge`` read the registries
of this module at call time, so a test may narrow them (the canaries do).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvstate import events as ev
from kvstate.invariants import CHECKS
from specs.sometimes import SOMETIMES, Edge
from specs.transitions import (
    TRANSITIONS,
    changed_pages,
    declared_refcount_delta,
    named_nodes,
    named_pages,
    named_requests,
)

StateCheck = Callable[[Any], list[str]]

ALWAYS: dict[str, StateCheck] = {}
for _name, _fn in CHECKS.items():
    ALWAYS[_name] = (lambda fn: lambda state: list(fn(state)))(_fn)


def _always(name: str) -> Callable[[StateCheck], StateCheck]:
    def register(fn: StateCheck) -> StateCheck:
        ALWAYS[name] = fn
        return fn

    return register


@_always("table_injective")
def _table_injective(state: Any) -> list[str]:
    """No table maps one page at two page indices (two positions would share a slot).

    Dangling entries map nothing; in block mode page 0 (vLLM's null block) may pad a
    table many times.
    """
    out = []
    for rid, record in state.requests.items():
        gone = record.dangling
        pages = [p for i, p in enumerate(record.pages) if p and i not in gone]
        if len(pages) != len(set(pages)):
            out.append(f"request {rid!r} maps a page twice: {pages}")
    return out


def sometimes_probe(name: str) -> Callable[[Edge], bool]:
    """The SOMETIMES probe ``name``: a core one (``SOMETIMES``), or ``swa:<name>`` /
    ``mamba:<name>`` from ``specs.sometimes_swa`` / ``specs.sometimes_mamba``."""
    prefix, _, rest = name.partition(":")
    if prefix == "swa" and rest:
        from specs.sometimes_swa import SWA_SOMETIMES

        return SWA_SOMETIMES[rest]
    if prefix == "mamba" and rest:
        from specs.sometimes_mamba import MAMBA_SOMETIMES

        return MAMBA_SOMETIMES[rest]
    return SOMETIMES[name]


def check_state(state: Any) -> list[tuple[str, str]]:
    """Every ALWAYS violation as ``(name, message)``."""
    return [(name, msg) for name, fn in ALWAYS.items() for msg in fn(state)]


def check_edge(before: Any, event: ev.Event, after: Any) -> list[tuple[str, str]]:
    """Every TRANSITIONS violation on one accepted edge as ``(name, message)``."""
    return [(name, msg) for name, fn in TRANSITIONS.items() for msg in fn(before, event, after)]


__all__ = ["ALWAYS", "SOMETIMES", "TRANSITIONS", "Edge", "changed_pages", "check_edge",
           "check_state", "declared_refcount_delta", "named_nodes", "named_pages",
           "named_requests", "sometimes_probe"]
