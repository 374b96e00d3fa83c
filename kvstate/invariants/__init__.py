"""Named invariants: ``check(state) -> list[Violation]`` over a frozen or a live state.

``core`` (pages, rows, tree, requests), ``host`` (the host tier, H1-H3), and
``incremental`` (the same properties checked only where a batch of events
touched the state, for replay with a check after every event).  All
recompute from scratch what they check; none trusts the rules' bookkeeping.
"""

from kvstate.invariants import core as _core  # noqa: F401  (registers the core checks)
from kvstate.invariants import host as _host  # noqa: F401  (registers the host checks)
from kvstate.invariants.registry import CHECKS, HOST_NAMES, Violation, named, run_checks


def check(state: object, names: tuple[str, ...] | None = None) -> list[Violation]:
    """Run the named checks (all that apply by default) and return every violation found."""
    return run_checks(state, names)


__all__ = ["CHECKS", "HOST_NAMES", "Violation", "check", "named", "run_checks"]
