"""Hostile calls to the SGLang hybrid front ends: a typed error and nothing changed (the
engine's fingerprint, the request's own record), where each was accepted before and
broke the log, dropped another holder's lock, freed SWA the request still reads, or
leaked pages."""

from __future__ import annotations

import pytest

from kvstate.backends.persistent import apply_all
from kvstate.invariants import check
from kvstate.sglang import hybrid_scheduler as hs
from kvstate.sglang.allocator import TokenToKVPoolAllocator
from kvstate.sglang.hybrid_req import HybridCacheInitParams, HybridReq
from kvstate.sglang.mamba_pool import HybridReqToTokenPool
from kvstate.sglang.mamba_radix_cache import MambaCacheInitParams
from kvstate.sglang.mamba_req import MambaReq
from kvstate.sglang.params import EvictParams, InsertParams, MatchPrefixParams, RadixKey
from kvstate.sglang.pool import ReqToTokenPool
from kvstate.sglang.swa_allocator import SWATokenToKVPoolAllocator
from kvstate.sglang.unified_radix_cache import UnifiedRadixCache


def swa_cache(page_size: int):
    pool = ReqToTokenPool(4, 64)
    allocator = SWATokenToKVPoolAllocator(64, 48, page_size)
    return UnifiedRadixCache(HybridCacheInitParams(pool, allocator, page_size, 4)), allocator


def decoding(cache, steps: int) -> HybridReq:
    """A request admitted, prefilled and decoded ``steps`` tokens."""
    request = HybridReq("a", list(range(1, 14)))
    hs.admit(cache, request)
    hs.prefill_done(cache, request, 50)
    for token in range(steps):
        hs.decode_step(cache, [request], 60 + token, interval=1)
    return request


def replays(cache) -> bool:
    engine = cache.engine
    return apply_all(engine.initial_state, list(engine.events)).fingerprint() == \
        engine.state.fingerprint()


def test_a_mamba_slot_a_request_brings_must_be_a_slot_id() -> None:
    pool = HybridReqToTokenPool(size=4, mamba_size=8, max_context_len=64)
    cache = UnifiedRadixCache(MambaCacheInitParams(
        req_to_token_pool=pool, token_to_kv_pool_allocator=TokenToKVPoolAllocator(64),
        page_size=1, tree_components=("FULL", "MAMBA"), mamba_chunk_size=4,
        mamba_track_interval=8))
    pool.mamba_allocator.alloc(1)
    before = cache.engine.state.fingerprint()
    for bad, error in ((True, TypeError), (1.0, TypeError), (0, ValueError)):
        request = MambaReq(1, [1, 2])
        request.kv.mamba_pool_idx = bad
        with pytest.raises(error):
            pool.alloc([request])
        assert cache.engine.state.fingerprint() == before and request.kv.req_pool_idx is None
    twice = MambaReq(2, [1, 2, 3])
    with pytest.raises(ValueError, match="named twice"):
        pool.alloc([twice, twice])
    assert cache.engine.state.fingerprint() == before
    assert pool.alloc([MambaReq(3, [1, 2])]) is not None and replays(cache)


def test_a_lock_unlocks_once() -> None:
    cache, allocator = swa_cache(1)
    tokens = list(range(1, 13))
    cache.insert(InsertParams(key=RadixKey(tokens), value=allocator.alloc(12)))
    node = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens))).last_device_node
    mine, theirs = cache.lock(node), cache.lock(node)
    cache.unlock(mine)
    before = cache.engine.state.fingerprint()
    with pytest.raises(ValueError, match="already unlocked"):
        cache.unlock(mine)  # would drop the lock ``theirs`` holds
    assert cache.engine.state.fingerprint() == before and node.lock_ref == 1
    assert cache.evict(EvictParams(num_tokens=12)).num_tokens_evicted == 0  # still pinned
    cache.unlock(theirs)
    assert node.lock_ref == 0 and check(cache.engine.state) == [] and replays(cache)


def test_sliding_window_frees_stop_at_the_row() -> None:
    cache, _ = swa_cache(4)
    request = decoding(cache, 9)
    before = (cache.engine.state.fingerprint(), request.kv.get_evicted_seqlen("SWA"))
    for past in (5, 6, 10):
        with pytest.raises(ValueError, match="past the"):
            cache.evict_sliding_windows(request, request.kv.kv_allocated_len + past)
        assert (cache.engine.state.fingerprint(), request.kv.get_evicted_seqlen("SWA")) == before
    hs.decode_step(cache, [request], 99, interval=1)  # the request still decodes
    assert check(cache.engine.state) == []


def test_a_release_protecting_more_than_the_request_owns_is_refused() -> None:
    cache, allocator = swa_cache(1)
    request = decoding(cache, 3)
    protected = request.kv.cache_protected_len
    request.kv.cache_protected_len = 30
    before = cache.engine.state.fingerprint()
    with pytest.raises(ValueError, match="protects 30 tokens"):
        cache.release_kv_cache(request, checkpoint=False)
    assert cache.engine.state.fingerprint() == before
    request.kv.cache_protected_len = protected
    cache.release_kv_cache(request, checkpoint=False)
    cache.evict(EvictParams(num_tokens=10**4, swa_num_tokens=10**4))
    assert (allocator.full_available_size(), allocator.swa_available_size()) == (64, 48)
