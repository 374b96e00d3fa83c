"""The Mamba front end: 0.5.23's call forms, the real mapping tensors, and bad input refused
with a typed error, changing nothing."""

from __future__ import annotations

import pytest
import torch

from kvstate.errors import InvalidEvent
from kvstate.invariants import check
from kvstate.planner.builder import PlanBuilder
from kvstate.planner.mamba_requests import MambaConfig, MambaCursor, plan_mamba_checkpoint
from kvstate.sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from kvstate.sglang.mamba_pool import HybridReqToTokenPool
from kvstate.sglang.mamba_radix_cache import MambaCacheInitParams, MambaUnifiedRadixCache
from kvstate.sglang.mamba_req import MambaReq
from kvstate.sglang.mamba_scheduler import admit, decode_step, finish, prefill_done
from kvstate.sglang.params import EvictParams, InsertParams, MatchPrefixParams, RadixKey
from kvstate.sglang.pool import ReqToTokenPool
from kvstate.sglang.swa_allocator import SWATokenToKVPoolAllocator
from kvstate.sglang.unified_radix_cache import UnifiedRadixCache
from kvstate.state import Geometry, initial_state


def build(*, extra=False, page=1, swa=False, slots=8):
    pool = HybridReqToTokenPool(size=4, mamba_size=slots, max_context_len=64,
                                enable_mamba_extra_buffer=extra)
    if swa:
        alloc = SWATokenToKVPoolAllocator(64, 48, page)
    else:
        alloc = TokenToKVPoolAllocator(64) if page == 1 else PagedTokenToKVPoolAllocator(64, page)
    components = ("FULL", "SWA", "MAMBA") if swa else ("FULL", "MAMBA")
    cache = UnifiedRadixCache(MambaCacheInitParams(
        req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=page,
        sliding_window_size=4 if swa else None, tree_components=components,
        enable_mamba_extra_buffer=extra, mamba_chunk_size=4, mamba_track_interval=8))
    return cache, pool, alloc


def test_the_unified_cache_builds_the_mamba_tree():
    cache, pool, _ = build()
    assert isinstance(cache, MambaUnifiedRadixCache) and isinstance(cache, UnifiedRadixCache)
    assert cache.supports_mamba() and not cache.supports_swa()
    assert pool.mamba_allocator.free_slots.tolist() == list(range(1, 9))
    assert cache.total_size() == (0, 0)
    cache, _, _ = build(swa=True)
    assert cache.supports_swa() and cache.total_size() == (0, 0, 0)


@pytest.mark.parametrize(("change", "error"), [
    ({"tree_components": ("FULL", "SWA")}, TypeError),
    ({"tree_components": ("MAMBA",)}, ValueError),
    ({"enable_mamba_extra_buffer": True}, ValueError),  # the pool has no extra buffer
    ({"eviction_policy": "lfu"}, ValueError),
    ({"mamba_chunk_size": 0}, ValueError),
])
def test_bad_cache_arguments(change, error):
    pool = HybridReqToTokenPool(size=2, mamba_size=4, max_context_len=16)
    alloc = TokenToKVPoolAllocator(16)
    fields = {"req_to_token_pool": pool, "token_to_kv_pool_allocator": alloc, "page_size": 1,
              "tree_components": ("FULL", "MAMBA"), **change}
    with pytest.raises(error):
        UnifiedRadixCache(MambaCacheInitParams(**fields))


def test_no_buffer_needs_page_one_and_a_hybrid_pool():
    pool = HybridReqToTokenPool(size=2, mamba_size=4, max_context_len=16)
    with pytest.raises(ValueError, match="page_size 1"):
        UnifiedRadixCache(MambaCacheInitParams(pool, PagedTokenToKVPoolAllocator(16, 4), 4))
    plain = ReqToTokenPool(2, 16)
    with pytest.raises(TypeError, match="HybridReqToTokenPool"):
        UnifiedRadixCache(MambaCacheInitParams(plain, TokenToKVPoolAllocator(16), 1))
    with pytest.raises(ValueError, match="mamba_size"):
        HybridReqToTokenPool(size=2, mamba_size=0, max_context_len=16)
    with pytest.raises(ValueError, match="lazy"):
        HybridReqToTokenPool(size=2, mamba_size=4, max_context_len=16,
                             enable_mamba_extra_buffer_lazy=True)


def test_alloc_gives_rows_slots_and_the_mapping():
    cache, pool, _ = build(extra=True, page=1)
    reqs = [MambaReq(1, [1, 2, 3]), MambaReq(2, [4, 5])]
    rows = pool.alloc(reqs)
    assert rows == [3, 4] and [r.kv.mamba_pool_idx for r in reqs] == [1, 4]
    assert [r.kv.mamba_ping_pong_track_buffer for r in reqs] == [[2, 3], [5, 6]]
    assert pool.req_index_to_mamba_index_mapping.tolist() == [0, 0, 0, 1, 4]
    assert pool.req_index_to_mamba_ping_pong_track_buffer_mapping[4].tolist() == [5, 6]
    assert pool.get_mamba_indices(torch.tensor([3, 4])).tolist() == [1, 4]
    assert pool.verify() == [] and reqs[0].kv.mamba_last_track_idx == 1
    before = cache.engine.state.fingerprint()
    with pytest.raises(MemoryError):
        pool.alloc([MambaReq(3, [1])])  # 3 slots needed, 2 free
    assert cache.engine.state.fingerprint() == before
    with pytest.raises(TypeError, match="Mamba KV records"):
        pool.alloc([object()])
    assert cache.engine.state.fingerprint() == before
    pool.req_index_to_mamba_index_mapping[3] = 7  # a write that bypassed the events
    assert [v.check for v in pool.verify()] == ["req_index_to_mamba_index_mapping"]


def test_slot_allocator_forms_and_refusals():
    cache, pool, _ = build()
    slots = pool.mamba_allocator.alloc(3)
    assert slots.tolist() == [1, 2, 3] and pool.mamba_allocator.available_size() == 5
    pool.mamba_allocator.free(slots[1:])
    assert pool.mamba_allocator.free_slots.tolist() == [4, 5, 6, 7, 8, 2, 3]
    assert pool.mamba_allocator.alloc(9) is None
    before = cache.engine.state.fingerprint()
    with pytest.raises(InvalidEvent, match="not held"):
        pool.mamba_allocator.free([5])
    with pytest.raises(TypeError):
        pool.mamba_allocator.alloc(1.5)
    with pytest.raises(ValueError):
        pool.mamba_allocator.free([0])
    assert cache.engine.state.fingerprint() == before


def test_insert_takes_a_state_or_keeps_its_own():
    cache, pool, alloc = build()
    state = pool.mamba_allocator.alloc(1)
    result = cache.insert(InsertParams(key=RadixKey([1, 2, 3]), value=alloc.alloc(3),
                                       mamba_value=state))
    assert (result.prefix_len, result.mamba_exist) == (0, False)
    again = pool.mamba_allocator.alloc(1)
    result = cache.insert(InsertParams(key=RadixKey([1, 2, 3]), value=alloc.alloc(3),
                                       mamba_value=again))
    assert (result.prefix_len, result.mamba_exist) == (3, True)
    pool.mamba_allocator.free(again)  # the caller's slot, not taken
    assert check(cache.engine.view) == []
    assert len(cache.engine.view.free_pages) == 64 - 3  # the duplicate copy went back
    values = alloc.alloc(1), alloc.alloc(1)
    before = cache.engine.state.fingerprint()
    with pytest.raises(ValueError, match="mamba_value"):
        cache.insert(InsertParams(key=RadixKey([4]), value=values[0]))
    with pytest.raises(ValueError, match="not one held"):
        cache.insert(InsertParams(key=RadixKey([5]), value=values[1], mamba_value=[8]))
    with pytest.raises(ValueError, match="cow_mamba needs"):
        cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2]), cow_mamba=True))
    with pytest.raises(TypeError):
        cache.evict(EvictParams(mamba_num=-0.5))
    with pytest.raises(ValueError):
        cache.evict(EvictParams(mamba_num=-1))
    assert cache.engine.state.fingerprint() == before


def test_locks_pin_the_hit_state_and_release_swa():
    for swa in (False, True):
        cache, pool, alloc = build(swa=swa)
        state = pool.mamba_allocator.alloc(1)
        cache.insert(InsertParams(key=RadixKey(list(range(1, 9))), value=alloc.alloc(8),
                                  mamba_value=state))
        found = cache.match_prefix(MatchPrefixParams(key=RadixKey(list(range(1, 10)))))
        assert found.device_prefix_len == 8
        lock = cache.lock(found.last_device_node)
        assert lock.mamba_locked and cache.mamba_protected_size() == 1
        assert cache.evict(EvictParams(num_tokens=8, mamba_num=1)).mamba_num_evicted == 0
        cache.release_swa(lock)
        assert cache.mamba_protected_size() == (0 if swa else 1)
        cache.unlock(lock)
        assert cache.mamba_protected_size() == 0 and check(cache.engine.view) == []
        with pytest.raises(TypeError):
            cache.unlock(object())


def test_release_of_an_unfinished_request_is_refused():
    cache, pool, _ = build()
    req = MambaReq(1, [1, 2, 3, 4, 5])
    admit(cache, req)
    prefill_done(cache, req, 9)
    before = cache.engine.state.fingerprint()
    with pytest.raises(ValueError, match="unfinished"):
        cache.release_kv_cache(req, checkpoint=True)
    assert cache.engine.state.fingerprint() == before
    decode_step(cache, [req], 7)
    finish(cache, req)
    assert pool.verify() == [] and check(cache.engine.view) == []
    assert req.kv.req_pool_idx is None and len(cache.engine.view.mamba.held) == 0


def test_finished_checkpoint_falls_back_to_the_other_track_slot():
    """0.5.23's ``_select_finished_checkpoint``: when the latest tracked checkpoint lies past
    the key, the previous one (in the other ping-pong slot) is donated."""
    state = initial_state(Geometry(num_pages=16, num_rows=2), mamba_slots=6)
    b = PlanBuilder(state)
    from kvstate import events as ev

    for event in (ev.ReqAlloc((1,)), ev.Allocate((1, 2, 3, 4, 5, 6, 7, 8), ((1, tuple(range(1, 9))),)),
                  ev.MambaAlloc((1, 2, 3)), ev.MambaBind(1, (1, 2, 3))):
        b.emit(event)
    cursor = MambaCursor(1, last_track_seqlen=8, prev_track_seqlen=4, keep=0)
    done = plan_mamba_checkpoint(b, cursor, list(range(10, 16)), up_to=6, finished=True,
                                 config=MambaConfig(extra_buffer=True))
    assert done.inserted is not None and done.inserted.prefix_len == 0
    tier = b.state.mamba
    assert [record.slot for record in tier.nodes.values()] == [3]  # entry 1 (the other one)
    assert list(tier.free_slots)[-2:] == [1, 2] and 1 not in tier.rows
    assert check(b.state) == []
    b2 = PlanBuilder(state)
    for event in b.events[:4]:
        b2.emit(event)
    cursor = MambaCursor(1, last_track_seqlen=8, prev_track_seqlen=7, keep=0)
    done = plan_mamba_checkpoint(b2, cursor, list(range(10, 16)), up_to=6, finished=True,
                                 config=MambaConfig(extra_buffer=True))
    assert done.inserted is None and not b2.state.mamba.nodes  # nothing can be keyed
    assert list(b2.state.mamba.free_slots)[-3:] == [1, 2, 3]
