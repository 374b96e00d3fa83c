"""``kvstate.planner.swa_decode`` on its own: a hybrid decode step and a prefill chunk decided
on a ``PlanBuilder`` over a small paged SWA state, where each outcome is pinned: the slots,
why a step stopped, the events and when the tree is asked to evict.

The base state (page size 4; FULL pages 1..6, SWA pages 1..4): row 1 holds positions 0..5
on pages 1 and 2 (paired with SWA 1 and 2), row 2 positions 0..1 on page 3 (SWA 3).
"""

from __future__ import annotations

from typing import Any

from kvstate import apply
from kvstate import events as ev
from kvstate.invariants import check
from kvstate.planner.builder import PlanBuilder
from kvstate.planner.swa_decode import (
    NO_SWA_PAGE,
    OUT_OF_MEMORY,
    DecodeStep,
    plan_decode_step,
    plan_extend_step,
)
from kvstate.state import Geometry, initial_state


def _base(num_pages: int = 6, swa_pages: int = 4) -> Any:
    state = initial_state(Geometry(num_pages=num_pages, num_rows=3, page_size=4),
                          swa_pages=swa_pages)
    for event in (ev.ReqAlloc((1, 2)), ev.Allocate((1, 2), ((1, (4, 5, 6, 7, 8, 9)),)),
                  ev.SwaAlloc(((1, 1), (2, 2))), ev.Allocate((3,), ((2, (12, 13)),)),
                  ev.SwaAlloc(((3, 3),))):
        state = apply(state, event)
    assert check(state) == []
    return state


class _Evictions:
    """An evictor that records what the step asked for and frees nothing."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, int]] = []

    def __call__(self, b: Any, full: int, swa: int) -> None:
        self.asked.append((full, swa))


def test_an_empty_decode_step_serves_nobody_and_emits_nothing() -> None:
    b = PlanBuilder(_base())
    assert plan_decode_step(b, [], [], evict=None, at_head=False) == DecodeStep(())
    assert b.events == []


def test_a_decode_step_with_room_asks_for_no_eviction() -> None:
    evictions = _Evictions()
    b = PlanBuilder(apply(_base(), ev.SwaFree((2,), False)))  # row 1's partial page: no SWA
    step = plan_decode_step(b, [], [(2, 2), (1, 6)], evict=evictions, at_head=False)
    assert step == DecodeStep((14,), NO_SWA_PAGE)  # row 2 served, row 1 stops the step
    assert b.events == [ev.Allocate((), ((2, (14,)),))]
    assert evictions.asked == []


def test_a_decode_step_asks_each_pool_for_its_own_shortfall() -> None:
    # FULL pages 4..6 free, SWA page 4 free: row 2 starts a page at position 4 after row 1
    state = _base()
    b = PlanBuilder(state)
    taken = [4, 5]  # leave FULL page 6 and SWA page 4 free; only the SWA pool gets short
    b.emit(ev.Allocate(tuple(taken)))
    b.emit(ev.SwaAlloc(((4, 4),)))
    evictions = _Evictions()
    step = plan_decode_step(b, [], [(1, 6), (2, 4)], evict=evictions, at_head=False)
    # each request in turn asks for one page's worth of each pool (SWA has none free); row 1
    # continues its page, row 2 needs a fresh one
    assert evictions.asked == [(0, 4), (0, 4)]
    assert step == DecodeStep((10,), OUT_OF_MEMORY)


def test_a_chunk_asks_for_its_shortfall_and_stops_without_a_swa_page() -> None:
    evictions = _Evictions()
    b = PlanBuilder(apply(_base(), ev.SwaFree((2,), False)))
    step = plan_extend_step(b, 1, 8, evict=evictions, headroom=4)
    assert step == DecodeStep((), NO_SWA_PAGE)  # continues page 2, which lost its SWA page
    assert b.events == []
    # 2 + 4 tokens wanted: 12 FULL and 4 SWA tokens free, so no eviction
    assert evictions.asked == []


def test_a_chunk_out_of_memory_and_a_chunk_of_only_the_hit() -> None:
    evictions = _Evictions()
    b = PlanBuilder(_base(swa_pages=3))  # no free SWA page
    assert plan_extend_step(b, 2, 9, evict=evictions, headroom=4) == \
        DecodeStep((), OUT_OF_MEMORY)
    assert evictions.asked == [(0, 11)] and b.events == []  # 7 + 4 SWA tokens short
    state = _base()
    hit = (16, 17, 18, 19)  # page 4, cached under the root
    for event in (ev.Allocate((4,)), ev.SwaAlloc(((4, 4),)), ev.Insert(0, (1, 2, 3, 4), hit, 1, 1),
                  ev.ReqAlloc((3,))):
        state = apply(state, event)
    b = PlanBuilder(state)
    assert plan_extend_step(b, 3, 4, prefix=hit, evict=None, headroom=0) == \
        DecodeStep(())  # the hit only: written, nothing allocated
    assert b.events == [ev.Assign(3, 0, hit)]
