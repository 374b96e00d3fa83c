"""What a hybrid layout saves on a trace: pools, batch sizes and three hit-rate runs per budget.

``trace_shape`` makes the one pass over the trace (lengths for the batch
table, the widest request, a bound on the units any run can occupy);
``run_model`` sizes the pools (``hybrid_pools``) and drives the trace three
times through SGLang 0.5.23's front end (``hybrid_driver``):

* ``full_attention``: the budget as a full-attention pool (every layer keeps KV);
* ``hybrid_full_rule``: the hybrid's full-attention pool, full-attention hit rule
  (what the capacity alone buys);
* ``hybrid``: the hybrid's pools and SGLang's hit rules (SWA windows, Mamba
  states), with the FULL reach of the same matches beside it.

A layout without SWA or Mamba layers runs only the first two.  The report
owns its results (frozen); formatting is ``kvstate.simulate.hybrid_output``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from fractions import Fraction
from typing import Any

import attrs

from kvstate.simulate.hybrid_driver import (
    CHUNKED_PREFILL_TOKENS,
    MAMBA_TRACK_INTERVAL,
    DriverPlan,
    SglangHybridSimulator,
)
from kvstate.simulate.hybrid_pools import MAMBA_SLOTS_HELD, Pools, batch_table, size_pools
from kvstate.simulate.models import HybridLayout
from kvstate.simulate.point import ProgressCallback, SimulationError
from kvstate.simulate.settings import SimulationResult, SimulationSettings
from kvstate.simulate.units import unit_key, unit_size, units_of
from kvstate.traces.records import TraceRequest

RUNS = ("full_attention", "hybrid_full_rule", "hybrid")


@attrs.frozen
class TraceShape:
    """What the runs need to know about a trace before the first one."""

    name: str
    requests: int
    block_size: int
    unit: int  # tokens per unit (hybrid_driver.unit_size)
    median_length: int  # prompt + output tokens, median (low) over requests
    p90_length: int  # nearest-rank 90th percentile
    width: int  # the most units one request holds, plus one
    unit_bound: int  # units every request together could occupy: a larger pool never evicts

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


def trace_shape(requests: Iterable[TraceRequest],
                on_request: Callable[[int], None] | None = None) -> TraceShape:
    """One pass over ``requests`` (malformed lines raise here, with their line)."""
    lengths: list[int] = []
    name, block, unit, width, bound = "", 0, 0, 1, 0
    for request in requests:
        if not lengths:
            name, block = request.source, request.block_size
            if block < 1:
                raise SimulationError(f"{name} has no hash blocks: a prefix hit rate needs them")
            unit = unit_size(block)
        total = request.prompt_length + request.output_length
        lengths.append(total)
        held = len(unit_key(request, unit)[0]) + units_of(request.output_length, unit) + 1
        width, bound = max(width, held + 1), bound + held
        if on_request is not None:
            on_request(len(lengths))
    if not lengths:
        raise SimulationError("the trace has no requests")
    ordered = sorted(lengths)
    p90 = ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]
    return TraceShape(name, len(lengths), block, unit, ordered[(len(ordered) - 1) // 2], p90,
                      width, bound)


@attrs.frozen
class ModelOptions:
    swa_ratio: Fraction
    mamba_ratio: Fraction
    decode: bool = True
    warmup: float = 0.0


@attrs.frozen
class ModelReport:
    """One layout at one budget on one trace."""

    layout: HybridLayout
    shape: TraceShape
    pools: Pools
    options: ModelOptions
    batches: tuple[dict[str, int], ...]
    results: dict[str, SimulationResult | None]
    reach_tokens: int | None  # FULL reach of the hybrid run's matches
    not_run: dict[str, str]  # run -> why it was not run

    def hit_rate(self, run: str) -> float | None:
        result = self.results.get(run)
        return None if result is None else result.hit_rate_tokens

    @property
    def reach_rate(self) -> float | None:
        result = self.results.get("hybrid")
        if result is None or self.reach_tokens is None or not result.total_tokens:
            return None
        return self.reach_tokens / result.total_tokens


def hybrid_plan(layout: HybridLayout, pools: Pools, shape: TraceShape) -> DriverPlan:
    unit = shape.unit
    return DriverPlan(
        "hybrid", pools.full_tokens // unit, shape.width, swa_units=pools.swa_tokens // unit,
        window_units=units_of(layout.window, unit) if layout.window else None,
        mamba_slots=pools.mamba_slots if layout.mamba_layers else 0,
        mamba_chunk_units=units_of(layout.mamba_chunk, unit),
        track_units=units_of(MAMBA_TRACK_INTERVAL, unit),
        prefill_chunk_units=units_of(CHUNKED_PREFILL_TOKENS, unit))


def why_not(plan: DriverPlan, pools: Pools) -> str | None:
    """Why SGLang would refuse to start with these pools (``None``: it starts)."""
    if plan.full_units < 1:
        return "the full-attention pool holds less than one unit"
    if plan.window_units is not None and plan.rule == "hybrid" and \
            plan.swa_units <= plan.window_units + 1:
        return "the SWA pool cannot hold one window (SGLang refuses to start)"
    if plan.rule == "hybrid" and plan.has_mamba and (pools.max_running or 0) < 1:
        return "too few Mamba slots for one running request (SGLang refuses to start)"
    if plan.rule == "hybrid" and pools.mamba_bytes and plan.mamba_slots < MAMBA_SLOTS_HELD:
        return "too few Mamba slots for one running request"
    return None


def run_model(layout: HybridLayout, memory_bytes: int, stream: Callable[[], Iterable[TraceRequest]],
              shape: TraceShape, options: ModelOptions,
              progress: Callable[[str, int], Any] | None = None) -> ModelReport:
    """Size the pools for ``memory_bytes`` and run the trace (``stream()``, read once per run).

    ``progress(label, total)`` may return a context manager whose value is
    a ``ProgressCallback`` (``kvstate.commands._progress.Progress``).
    """
    pools = size_pools(layout, memory_bytes, swa_ratio=options.swa_ratio,
                       mamba_ratio=options.mamba_ratio)
    batches = tuple(batch_table(layout, pools, length)
                    for length in (shape.median_length, shape.p90_length))
    unit = shape.unit
    plans = {"full_attention": DriverPlan("full", pools.fa_tokens // unit, shape.width),
             "hybrid_full_rule": DriverPlan("full", pools.full_tokens // unit, shape.width)}
    if layout.is_hybrid:
        plans["hybrid"] = hybrid_plan(layout, pools, shape)
    results: dict[str, SimulationResult | None] = {}
    not_run: dict[str, str] = {}
    reach: int | None = None
    for run, plan in plans.items():
        reason = why_not(plan, pools)
        if reason is not None:
            results[run], not_run[run] = None, reason
            continue
        settings = SimulationSettings(capacity_tokens=plan.full_units * unit, policy="lru",
                                      warmup=options.warmup, granularity="token", page_size=unit,
                                      cache_output=True, decode=options.decode)
        simulator = SglangHybridSimulator(settings, unit, shape.name, shape.unit_bound, plan)
        label = f"{layout.name} {run.replace('_', ' ')}"
        if progress is None:
            results[run] = simulator.run(stream(), shape.requests)
        else:
            with progress(label, shape.requests) as bar:
                callback: ProgressCallback = bar.update
                results[run] = simulator.run(stream(), shape.requests, callback)
        if run == "hybrid":
            reach = simulator.reach_tokens
    if not layout.is_hybrid:
        not_run["hybrid"] = "the layout has no sliding-window or Mamba layers"
        results["hybrid"] = None
    return ModelReport(layout, shape, pools, options, batches, results, reach, not_run)


__all__ = ["ModelOptions", "ModelReport", "RUNS", "TraceShape", "hybrid_plan", "run_model",
           "trace_shape", "why_not"]
