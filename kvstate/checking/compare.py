"""``kvstate check --compare``: a policy's hit rate against another's on a trace.

The explorer says whether a policy is *safe*; a safe policy can still cache
badly (most-recently-used first evicts exactly what the next turn needs).
This runs both policies through the simulator's own driver
(``kvstate.simulate.driver.simulate``: the real planner and reducer, one
request at a time in file order, outputs decoded, whole-trace window) at the
same capacities and reports token-weighted hit rates side by side.

Pure orchestration: it reads the trace file (streamed, once per run plus one
sizing pass) and returns new ``ComparePoint`` values; it owns no state.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from kvstate.simulate.driver import pages_needed, simulate
from kvstate.simulate.settings import Granularity, SimulationSettings
from kvstate.traces import TraceRequest, read_trace

DEFAULT_FRACTION = 10
"""With no capacity given, a tenth of the pages the whole trace would occupy (so both evict)."""


@attrs.frozen
class ComparePoint:
    """Both policies at one capacity, from the same requests."""

    capacity_pages: int
    unit_tokens: int
    policy: str
    baseline: str
    policy_hit: float  # token-weighted hit rate
    baseline_hit: float
    requests: int

    @property
    def difference(self) -> float:
        return self.policy_hit - self.baseline_hit

    def as_json(self) -> dict[str, Any]:
        return {"capacity_pages": self.capacity_pages, "capacity_tokens": self.capacity_pages
                * self.unit_tokens, "policy": self.policy, "baseline": self.baseline,
                "policy_hit_rate_tokens": round(self.policy_hit, 6),
                "baseline_hit_rate_tokens": round(self.baseline_hit, 6),
                "difference": round(self.difference, 6), "requests": self.requests}

    def line(self) -> str:
        return (f"{self.policy} vs {self.baseline} at {self.capacity_pages:,} pages "
                f"({self.capacity_pages * self.unit_tokens:,} tokens, {self.requests} requests): "
                f"hit {self.policy_hit:.4f} vs {self.baseline_hit:.4f} ({self.difference:+.4f})")


def compare_on_trace(policy: str, baseline: str, trace: str | Path,
                     capacities: Sequence[tuple[float, bool]] = (), *,
                     limit: int | None = None) -> list[ComparePoint]:
    """Hit rates of ``policy`` and ``baseline`` (simulator policy names, ``vllm`` included) on ``trace``.

    ``capacities`` are ``(amount, in_pages)`` pairs as ``kvstate simulate``
    parses them; none means one point at a tenth of the trace's pages.  Block
    granularity when the trace has hash blocks, else 16-token pages.
    """
    path = Path(trace)

    def stream() -> Iterator[TraceRequest]:
        return iter(read_trace(path, None, limit=limit, with_tokens=False))

    first = next(stream(), None)
    granularity: Granularity = "block" if first is not None and first.block_size else "token"
    shape = SimulationSettings(capacity_tokens=1, granularity=granularity)
    unit = first.block_size if granularity == "block" and first is not None else shape.page_size
    count = bound = 0
    for request in stream():
        count += 1
        bound += pages_needed((request,), shape, unit)
    points = list(capacities) or [(max(1, bound // DEFAULT_FRACTION), True)]
    out = []
    for amount, in_pages in points:
        tokens = int(amount * unit) if in_pages else int(amount)
        rates = []
        for name in (policy, baseline):
            settings = SimulationSettings(capacity_tokens=tokens, policy=name,
                                          granularity=granularity)
            rates.append(simulate(stream(), settings, count, page_bound=bound).hit_rate_tokens)
        out.append(ComparePoint(tokens // unit, unit, policy, baseline, rates[0], rates[1], count))
    return out
