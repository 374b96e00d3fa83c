"""Summary statistics and the Azure slot-utilization split.

Pure functions: they read their inputs and return new values; nothing is
mutated.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "count": len(values),
        "min": min(values),
        "p25": percentile(values, 0.25),
        "median": percentile(values, 0.5),
        "p75": percentile(values, 0.75),
        "max": max(values),
        "mean": statistics.fmean(values),
    }


def utilization(rows: Sequence[tuple[int, int]], page: int, max_output: int) -> dict[str, Any]:
    """Slot-steps by state, summed over every decode step of every request.

    At step ``t`` (1..o) a request of prompt ``p`` holds ``p + t`` token states.
    reserve-max holds ``p + max_output`` slots: ``p + o - (p + t)`` will be
    filled later (reservation) and ``max_output - o`` never (internal
    fragmentation).  max_context holds the trace's longest sequence rounded up
    to a power of two for every request (Orca(Max) reserved the model's
    2,048-token limit; these prompts are longer).  pow2 holds
    ``2 ** ceil(log2(p + o))``.  oracle holds ``p + o``.  paged holds
    ``ceil((p + t) / page)`` pages; the empty slots of the last page are
    internal fragmentation.
    """
    names = ("max_context", "max", "pow2", "oracle", "paged")
    totals = {name: {"tokens": 0, "reservation": 0, "internal": 0} for name in names}
    context = 1 << (max(p + o for p, o in rows) - 1).bit_length()
    for prompt, output in rows:
        steps = output
        if steps == 0:
            continue
        state_sum = steps * prompt + steps * (steps + 1) // 2  # sum of p + t for t in 1..o
        final = prompt + output
        future = steps * final - state_sum
        for name, held in (
            ("max_context", context),
            ("max", prompt + max_output),
            ("pow2", 1 << (final - 1).bit_length()),
            ("oracle", final),
        ):
            totals[name]["tokens"] += state_sum
            totals[name]["reservation"] += future
            totals[name]["internal"] += steps * held - steps * final
        paged_waste = sum((-(prompt + t)) % page for t in range(1, steps + 1))
        totals["paged"]["tokens"] += state_sum
        totals["paged"]["internal"] += paged_waste
    shares = {}
    for name, parts in totals.items():
        whole = sum(parts.values())
        shares[name] = {key: value / whole for key, value in parts.items()}
    return shares
