"""The event rules, each written once, for both backends.

A rule is ``rule(s, event) -> None``.  ``s`` is a *store*: the state's
containers opened for editing.  The persistent backend
(``kvstate.backends.persistent``) hands a rule a transaction over a frozen
``State`` and builds the next ``State`` from it; the live backend
(``kvstate.backends.live``) hands it the live engine's own containers.  Rules
see the same names either way (``kvstate.rules.store.Store``).

Every rule checks every precondition before its first write and signals a
violation by raising ``Reject`` (the backends turn it into ``InvalidEvent``
naming the event).  So a rejected event changes nothing on either backend.
Nothing here imports torch, time, random or os.
"""

from __future__ import annotations

# Register every rule (imported for their side effect on RULES).
from kvstate.rules import (  # noqa: F401
    block,
    block_tree,
    frees,
    host,
    mamba,
    pages,
    rows,
    swa,
    swa_recover,
    tree,
)
from kvstate.rules.registry import RULE_MODES, RULES, Reject, Rule, rule

__all__ = ["RULES", "RULE_MODES", "Reject", "Rule", "rule"]
