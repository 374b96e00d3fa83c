"""What every simulator of one capacity point shares: counters, the request loop, the result.

``PointSimulator`` is the base of ``driver.TraceSimulator`` (the radix
planner) and ``vllm_driver.VllmTraceSimulator`` (vLLM's block pool); a
subclass provides ``step`` (and, for batching, ``admit`` /
``extend_active`` / ``finish``) and an ``engine``.  ``run_point`` builds one
for a request stream, optionally under continuous batching and with a
``Recorder``.  Simulators own their engine and ``Counters`` and mutate only
them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from kvstate.simulate.settings import SimulationResult, SimulationSettings
from kvstate.traces.records import TraceRequest

ProgressCallback = Callable[[int], None]


class SimulationError(ValueError):
    """The trace and the settings do not fit together (for example block mode without hashes)."""


class Counters:
    """The run's tallies (a simulator owns one and mutates it as requests go by)."""

    def __init__(self) -> None:
        self.requests = self.measured = 0
        self.hit_tokens = self.total_tokens = self.hit_blocks = self.total_blocks = 0
        self.evicted = self.peak = self.rejected = self.retracted = 0
        self.filled = False
        self.waited = 0


class PointSimulator:
    """The request loop and the result of one capacity point (subclasses define ``step``)."""

    settings: SimulationSettings
    trace_name: str
    unit_tokens: int
    capacity_pages: int
    pool_pages: int
    counters: Counters
    engine: Any

    def _init_point(self, settings: SimulationSettings, unit_tokens: int, trace_name: str,
                    page_bound: int | None) -> None:
        """Settings, capacity in pages, and the pool actually built (at most ``page_bound``).

        ``page_bound`` is the most pages the trace can ever occupy
        (``driver.pages_needed``): a larger capacity behaves identically, so
        the pool is built no larger than that.
        """
        self.settings = settings
        self.unit_tokens = unit_tokens
        self.trace_name = trace_name
        self.capacity_pages = settings.capacity_tokens // unit_tokens
        if self.capacity_pages < 1:
            raise SimulationError(
                f"capacity {settings.capacity_tokens} tokens is less than one page of {unit_tokens}"
            )
        pool = self.capacity_pages if page_bound is None else min(self.capacity_pages, page_bound)
        self.pool_pages = max(pool, 1)
        self.counters = Counters()

    def step(self, index: int, request: TraceRequest, measured: bool) -> None:
        raise NotImplementedError

    def _measure_counts(self, hit_tokens: int, total_tokens: int, hit_blocks: int,
                        total_blocks: int) -> None:
        """Count one measured lookup (hits against totals, in tokens and in blocks)."""
        counters = self.counters
        counters.measured += 1
        counters.hit_tokens += hit_tokens
        counters.total_tokens += total_tokens
        counters.hit_blocks += hit_blocks
        counters.total_blocks += total_blocks

    def _measure_units(self, weights: Sequence[int], hit_units: int) -> None:
        """Count one measured lookup in block units of ``weights`` tokens; the first ``hit_units`` hit."""
        self._measure_counts(sum(weights[:hit_units]), sum(weights), hit_units, len(weights))

    def run(
        self,
        requests: Iterable[TraceRequest],
        request_count: int,
        progress: ProgressCallback | None = None,
    ) -> SimulationResult:
        first_measured = math.floor(request_count * self.settings.warmup)
        for index, request in enumerate(requests):
            self.step(index, request, measured=index >= first_measured)
            if progress is not None and index % 256 == 255:
                progress(index + 1)
        if progress is not None:
            progress(self.counters.requests)
        return self.result()

    def result(self) -> SimulationResult:
        c = self.counters
        return SimulationResult(
            settings=self.settings,
            trace=self.trace_name,
            unit_tokens=self.unit_tokens,
            capacity_pages=self.capacity_pages,
            requests=c.requests,
            measured_requests=c.measured,
            hit_tokens=c.hit_tokens,
            total_tokens=c.total_tokens,
            hit_blocks=c.hit_blocks,
            total_blocks=c.total_blocks,
            evicted_pages=c.evicted,
            peak_pages=c.peak,
            rejected_requests=c.rejected,
            retracted_requests=c.retracted,
            waited_requests=c.waited,
            underfilled=self.settings.warmup > 0 and not c.filled,
        )


def unit_tokens_for(settings: SimulationSettings, first: TraceRequest | None) -> int:
    """Tokens per page: the trace's block size in block granularity, else ``page_size``."""
    if settings.granularity == "token":
        return settings.page_size
    if first is None:
        return 1
    if first.block_size < 1:
        raise SimulationError(f"{first.source} has no hash blocks; use --granularity token for this trace")
    return first.block_size


SimulatorFactory = Callable[[SimulationSettings, int, str, "int | None"], PointSimulator]


def run_point(
    make: SimulatorFactory,
    requests: Iterable[TraceRequest],
    settings: SimulationSettings,
    request_count: int,
    *,
    record: str | Path | None = None,
    progress: ProgressCallback | None = None,
    page_bound: int | None = None,
) -> SimulationResult:
    """Build ``make(settings, unit_tokens, trace_name, page_bound)`` and run the stream through it."""
    iterator = iter(requests)
    first = next(iterator, None)
    unit = unit_tokens_for(settings, first)
    name = first.source if first is not None else ""
    simulator = make(settings, unit, name, page_bound)
    stream: Iterable[TraceRequest] = [] if first is None else _chain_first(first, iterator)
    runner: Any = simulator
    if settings.max_running is not None:
        from kvstate.simulate.batching import BatchingSimulator

        # both simulators provide admit / extend_active / finish for batching
        runner = BatchingSimulator(simulator, settings.max_running, settings.step_ms)  # type: ignore[arg-type]
    if record is None:
        return runner.run(stream, request_count, progress)  # type: ignore[no-any-return]
    from kvstate.log.recorder import Recorder

    # In block granularity one page (page_size 1) is one trace block of ``unit`` tokens: the header's
    # tokens_per_slot says so (replay multiplies its token counts by it).
    slot_tokens = unit if settings.granularity == "block" else 1
    meta = {"workload": "trace", "trace": name, "settings": repr(settings),
            "granularity": settings.granularity, "tokens_per_slot": slot_tokens}
    with Recorder(simulator.engine, record, meta=meta):
        return runner.run(stream, request_count, progress)  # type: ignore[no-any-return]


def _chain_first(first: TraceRequest, rest: Iterable[TraceRequest]) -> Iterator[TraceRequest]:
    yield first
    yield from rest
