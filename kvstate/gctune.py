"""``tune_gc``: what a serving process may do with CPython's collector around kvstate.

The live backend holds every page, request and tree node in dicts and small
records the cyclic collector tracks.  None of them form cycles kvstate needs
collected, but a full collection still walks them all.  kvstate never changes
the collector by itself (that is the host program's choice); a server calls
``tune_gc()`` once after building its engine, pools and model: everything
allocated so far moves to the permanent generation (``gc.freeze``) and the
young-generation threshold is raised, so collections run less often and
never rescan the setup.  Returns the previous thresholds, so a caller can
restore them with ``gc.set_threshold(*previous)``.
"""

from __future__ import annotations

import gc

DEFAULT_THRESHOLD0 = 50_000


def tune_gc(threshold0: int = DEFAULT_THRESHOLD0) -> tuple[int, int, int]:
    """Freeze what exists now and raise the young-generation threshold; the old thresholds."""
    if isinstance(threshold0, bool) or not isinstance(threshold0, int) or threshold0 <= 0:
        raise ValueError(f"threshold0 must be a positive int, got {threshold0!r}")
    previous = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(threshold0, previous[1], previous[2])
    return previous
