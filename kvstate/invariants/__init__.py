"""Named invariants: ``check(state) -> list[Violation]`` over a frozen or a live state.

``core`` (pages, rows, tree, requests), ``host`` (the host tier, H1-H3),
``swa`` (the SWA pool of a FULL + SWA hybrid, its own registry ``SWA_CHECKS``),
``mamba`` (the Mamba state pool, ``MAMBA_CHECKS``) and ``incremental`` (the
same properties checked only where a batch of events touched the state, for
replay with a check after every event).  All
recompute from scratch what they check; none trusts the rules' bookkeeping.
"""

from kvstate.invariants import core as _core  # noqa: F401  (registers the core checks)
from kvstate.invariants import host as _host  # noqa: F401  (registers the host checks)
from kvstate.invariants.mamba import MAMBA_CHECKS, check_mamba
from kvstate.invariants.registry import CHECKS, HOST_NAMES, Violation, named, run_checks
from kvstate.invariants.swa import SWA_CHECKS, check_swa


def check(state: object, names: tuple[str, ...] | None = None) -> list[Violation]:
    """Run the named checks (all that apply by default; on a state with an SWA or a Mamba
    pool, its checks after the core's) and return every violation found."""
    if names is None:
        found = run_checks(state, None)
        found += [Violation(name, message) for name, message in check_swa(state)]
        return found + [Violation(name, message) for name, message in check_mamba(state)]
    core = tuple(name for name in names if name not in SWA_CHECKS and name not in MAMBA_CHECKS)
    pool = tuple(name for name in names if name in SWA_CHECKS)
    states = tuple(name for name in names if name in MAMBA_CHECKS)
    found = run_checks(state, core) if core else []
    found += [Violation(name, message) for name, message in check_swa(state, pool)]
    if states:
        found += [Violation(name, message) for name, message in check_mamba(state, states)]
    return found


__all__ = ["CHECKS", "HOST_NAMES", "MAMBA_CHECKS", "SWA_CHECKS", "Violation", "check", "named",
           "run_checks"]
