"""``kvstate.planner.block`` on its own: the vLLM front end's decisions as pure functions.

The front end runs these functions inside an engine batch; here they run on a
standalone ``PlanBuilder`` over a frozen state and must decide the same.
"""

from __future__ import annotations

import pytest

from kvstate.events import BlockAlloc, BlockCache, BlockHold, BlockUncache, ReqAlloc
from kvstate.planner.block import plan_allocate_slots, plan_free_request, plan_get_new_blocks
from kvstate.planner.block_hits import NULL, Running, cached_prefix, check_hits
from kvstate.planner.builder import PlanBuilder
from kvstate.state import Geometry, initial_state
from kvstate.vllm.manager import KVCacheManager
from kvstate.vllm.request import Request
from tests.vllm_helpers import admit

BS = 4


def test_a_plan_on_a_frozen_state_equals_the_live_front_end() -> None:
    manager = KVCacheManager(8, BS, 64)
    admit(manager, Request("a", list(range(9)), BS))
    manager.free("a")
    base = manager.engine.state
    second = Request("b", list(range(13)), BS)
    hits = cached_prefix(base, second, (second.num_tokens - 1) // BS, None)
    assert hits == [1, 2]
    b = PlanBuilder(base)
    done = plan_allocate_slots(b, "b", second, None, hits, num_local=8, need_slots=13,
                               cache_upto=13, remove_upto=8, window=None, caching=True)
    assert done is not None and done.new_pages == (3, 4) and done.running == Running(3, 3)
    assert [type(event) for event in b.events] == [ReqAlloc, BlockHold, BlockAlloc, BlockCache]
    assert base.seq == manager.engine.state.seq  # the plan changed nothing live

    blocks, hit, _ = manager.get_computed_blocks(second)
    manager.allocate_slots(second, 13 - hit, hit, blocks)
    assert manager.engine.state == b.state
    assert manager.running["b"] == done.running


def test_lazy_eviction_uncaches_before_reuse_and_refusals_emit_nothing() -> None:
    manager = KVCacheManager(4, BS, 64)
    admit(manager, Request("a", list(range(9)), BS))  # caches blocks 1 and 2
    manager.free("a")  # queue: 3 (uncached, head), then cached 2, 1 at the tail
    b = PlanBuilder(manager.engine.state)
    with pytest.raises(ValueError, match="Cannot get 4 free blocks"):
        plan_get_new_blocks(b, 0, 4)
    assert b.events == []
    assert plan_get_new_blocks(b, 0, 2) == [3, 2]
    assert [type(event) for event in b.events] == [BlockUncache, BlockAlloc]
    assert b.events[0] == BlockUncache((2,), (2,))
    plan_free_request(b, "nobody", caching=True)
    assert len(b.events) == 2


def test_the_admission_check_refuses_with_nothing_but_the_window_release() -> None:
    state = initial_state(Geometry(num_pages=3, page_size=BS, mode="block"))
    b = PlanBuilder(state)
    request = Request("r", list(range(20)), BS)
    assert plan_allocate_slots(b, "r", request, None, None, num_local=0, need_slots=20,
                               cache_upto=20, remove_upto=0, window=None, caching=True) is None
    assert b.events == [] and b.state is state


def test_hits_a_caller_passes_are_checked_before_anything() -> None:
    """``check_hits``: every refusal of a forged ``get_computed_blocks`` result, with its
    message, and the hits it accepts (nulls for skipped positions, a lookup of its own)."""
    manager = KVCacheManager(8, BS, 64)
    admit(manager, Request("a", list(range(9)), BS))  # caches block 1 (node 1) and 2 (node 2)
    manager.free("a")
    admit(manager, Request("c", [50] * 5, BS))
    state = manager.engine.state
    assert dict(state.page_node) == {1: 1, 2: 2, 3: 3} and state.requests["c"].pages == (3, 4)
    second = Request("b", list(range(13)), BS)  # three full blocks, the first two cached

    def check(hits: list[int], *, running: Running | None = None, request_id: str = "b",
              num_local: int = 8, window: int | None = None, caching: bool = True,
              found_here: bool = False) -> None:
        check_hits(state, request_id, second, running, hits, num_local, window=window,
                   caching=caching, found_here=found_here)

    check([1, 2])
    check([NULL, 2], window=4)  # 8 computed, window 4: block 0 is skipped, a null keeps it
    check([], running=Running(1, 1))
    check([3], found_here=True)  # the caller's own lookup: no per-block check
    check([NULL], window=4, caching=False)  # 8 computed, window 4: block 0 is skipped
    refusals = [
        ([1], {"running": Running(1, 1)}, "running request 'b' cannot take new prefix hits"),
        ([1], {"request_id": "c"}, "request 'c' already has blocks; only a new request takes "
                                   "prefix hits"),
        ([1, 2, NULL, NULL], {}, "4 hit blocks for 3 full blocks"),
        ([1], {"caching": False}, "computed blocks must be empty when prefix caching is "
                                  "disabled"),
        ([NULL, NULL], {"window": 4, "caching": False}, "must be empty"),
        ([2, 1], {}, "block 2 is not a cached copy of block 0 of request 'b' "
                     r"\(or it is given twice\)"),
        ([1, 1], {}, "block 1 is not a cached copy of block 1"),
        ([3], {}, "block 3 is not a cached copy of block 0"),  # another prefix's block
        ([4], {}, "block 4 is not a cached copy of block 0"),  # in use, not cached
        ([NULL, 7], {"window": 4}, "block 7 is not a cached copy of block 1"),  # never cached
        ([NULL, 2], {}, "hit block 0 of request 'b' is the null block"),  # full attention
        ([1, NULL], {"window": 4}, "hit block 1 .* is the null block"),  # inside the window
    ]
    for hits, options, message in refusals:
        with pytest.raises(ValueError, match=message):
            check(hits, **options)  # type: ignore[arg-type]
