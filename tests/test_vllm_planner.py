"""``kvstate.planner.block`` on its own: the vLLM front end's decisions as pure functions.

The front end runs these functions inside an engine batch; here they run on a
standalone ``PlanBuilder`` over a frozen state and must decide the same.
"""

from __future__ import annotations

import pytest

from kvstate.events import BlockAlloc, BlockCache, BlockHold, BlockUncache, ReqAlloc
from kvstate.planner.block import plan_allocate_slots, plan_free_request, plan_get_new_blocks
from kvstate.planner.block_hits import Running, cached_prefix
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
