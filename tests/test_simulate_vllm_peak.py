"""``peak_pages`` under ``--policy vllm``: pages held or cached, counted once each.

A page is occupied when a request holds it or it is cached (a cached page
nobody holds sits in the free queue but still takes room).  Under batching a
cached prefix block can be held by several running requests at once; it is
still one page.  The reference here subscribes to the engine and counts the
occupied pages of ``1..N`` after every event, independently of the driver.
"""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstate.simulate import SimulationSettings
from kvstate.simulate.batching import BatchingSimulator
from kvstate.simulate.vllm_driver import VllmTraceSimulator
from kvstate.traces import TraceRequest
from tests.trace_fixtures import BLOCK, chain_requests


def occupied_pages(state: Any) -> int:
    """Pages ``1..N`` that a request holds or the cache keeps (each counted once)."""
    return sum(
        1
        for page in range(1, state.geometry.num_pages + 1)
        if page not in state.free_pages or page in state.page_node
    )


def batched_peaks(
    requests: list[TraceRequest], capacity: int, max_running: int
) -> tuple[int, int]:
    """(the driver's ``peak_pages``, the most occupied pages seen after any event)."""
    run = SimulationSettings(
        capacity_tokens=capacity * BLOCK, policy="vllm", max_running=max_running, step_ms=1000.0
    )
    simulator = VllmTraceSimulator(run, BLOCK, "fixture")
    seen = [0]

    def watch(event: object, state: Any) -> None:
        seen[0] = max(seen[0], occupied_pages(state))

    simulator.engine.subscribe(watch)
    result = BatchingSimulator(simulator, max_running, 1000.0).run(requests, len(requests))
    return result.peak_pages, seen[0]


def timed(requests: list[TraceRequest], arrivals: list[float], outputs: list[int]) -> list[TraceRequest]:
    return [
        attrs.evolve(request, arrival_s=arrival, output_length=output)
        for request, arrival, output in zip(requests, arrivals, outputs, strict=True)
    ]


def test_a_prefix_shared_by_two_running_requests_counts_once() -> None:
    # r0 = A B + 1 token decodes 3 tokens (no new block); r1 = A B + 2 tokens arrives a
    # step later and holds r0's cached A and B too.  While both run, A, B and the two
    # partial tails are occupied: 4 pages (A and B once each).  When they finish the
    # uncached tails go back, so the peak is only reached while A and B are shared.
    requests = timed(chain_requests([([0, 0, 0], 1), ([0, 0, 1], 2)]), [0.0, 1.0], [3, 1])
    peak, reference = batched_peaks(requests, 16, max_running=4)
    assert reference == 4
    assert peak == reference


def test_three_running_requests_on_one_prefix() -> None:
    # A B shared by three requests admitted together, each with its own partial tail.
    requests = timed(
        chain_requests([([0, 0, 0], 1), ([0, 0, 1], 1), ([0, 0, 2], 1)]), [0.0, 0.0, 0.0], [2, 2, 2]
    )
    peak, reference = batched_peaks(requests, 16, max_running=3)
    assert reference == 5
    assert peak == reference


prompts = st.lists(
    st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=5), st.integers(1, BLOCK)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=prompts,
    capacity=st.integers(3, 12),
    max_running=st.integers(1, 4),
    timing=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 12)), min_size=12, max_size=12),
)
def test_peak_is_the_most_pages_ever_held_or_cached(
    case: list[tuple[list[int], int]], capacity: int, max_running: int, timing: list[tuple[int, int]]
) -> None:
    requests = chain_requests(case)
    arrivals = sorted(float(arrival) for arrival, _ in timing[: len(requests)])
    requests = timed(requests, arrivals, [output for _, output in timing[: len(requests)]])
    peak, reference = batched_peaks(requests, capacity, max_running)
    assert peak == reference
