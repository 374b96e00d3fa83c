"""The worked SWA examples of shared/reference/hybrid.md (sections 1.2 and 1.4), on kvstate.

Window 4, FULL 64 and SWA 32 slots (64 with the chain), as SGLang 0.5.23's
runs in shared/peers/hybrid/out/ captured them; the numbers below are that
output's.  The request flows are ``kvstate.sglang.hybrid_scheduler``'s, in
0.5.23's scheduler order.
"""

from __future__ import annotations

import pytest

from kvstate.planner.swa_evict import swa_lru
from kvstate.sglang.hybrid_req import HybridCacheInitParams, HybridInsertParams, HybridReq
from kvstate.sglang.hybrid_scheduler import admit, decode_step, finish, prefill_done
from kvstate.sglang.params import EvictParams, MatchPrefixParams, RadixKey
from kvstate.sglang.pool import ReqToTokenPool
from kvstate.sglang.swa_allocator import SWATokenToKVPoolAllocator
from kvstate.sglang.unified_radix_cache import UnifiedRadixCache

PROMPT = list(range(100, 112))
BRANCH = PROMPT + [900, 901, 555, 556]


def build(page_size: int = 1, swa: int = 32) -> UnifiedRadixCache:
    pool = ReqToTokenPool(8, 256)
    allocator = SWATokenToKVPoolAllocator(64, swa, page_size)
    return UnifiedRadixCache(HybridCacheInitParams(pool, allocator, page_size, 4))


def match(cache: UnifiedRadixCache, tokens: list[int]) -> tuple:
    found = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens)))
    return found.device_prefix_len, found.full_kv_hit_length, found.swa_branching_seqlen


def sizes(cache: UnifiedRadixCache) -> tuple:
    return (cache.full_evictable_size(), cache.full_protected_size(),
            cache.swa_evictable_size(), cache.swa_protected_size())


def frees(cache: UnifiedRadixCache) -> tuple[list[int], list[int]]:
    allocator = cache.token_to_kv_pool_allocator
    return (allocator.full_attn_allocator.free_pages.tolist(),
            allocator.swa_attn_allocator.free_pages.tolist())


def mapping(cache: UnifiedRadixCache) -> dict[int, int]:
    table = cache.token_to_kv_pool_allocator.full_to_swa_index_mapping
    return {i: int(table[i]) for i in range(len(table) - 1) if int(table[i])}


def nodes(cache: UnifiedRadixCache) -> dict[tuple, tuple]:
    """Root path -> (FULL pages, live SWA, FULL lock, SWA lock)."""
    view, out = cache.engine.view, {}
    stack = [(0, ())]
    while stack:
        node_id, path = stack.pop()
        for child_id in view.nodes[node_id].children.values():
            child = view.nodes[child_id]
            out[path + child.key] = (child.pages, child.swa.live, child.lock_ref,
                                     child.swa.lock_ref)
            stack.append((child_id, path + child.key))
    return out


def test_window_slides_and_a_branch_recovers_its_tombstone():
    cache = build()
    a = HybridReq("A", PROMPT)
    assert admit(cache, a).tolist() == list(range(1, 13))
    prefill_done(cache, a, 900)
    # the checkpoint freed SWA for positions 0..6: a tombstone, a live node, the locked window
    assert frees(cache)[1][-7:] == list(range(1, 8))
    assert mapping(cache) == {i: i for i in range(8, 13)}
    tree = nodes(cache)
    assert tree[tuple(PROMPT[:7])] == ((1, 2, 3, 4, 5, 6, 7), False, 1, 0)
    assert tree[tuple(PROMPT[:8])] == ((8,), True, 1, 0)
    assert tree[tuple(PROMPT)] == ((9, 10, 11, 12), True, 1, 1)
    assert sizes(cache) == (0, 12, 1, 4)
    for step in range(6):
        decode_step(cache, [a], 901 + step, interval=1)
    assert a.kv.get_evicted_seqlen("SWA") == 13 and frees(cache)[1][-1] == 13
    finish(cache, a)
    assert sizes(cache) == (18, 0, 10, 0)
    assert match(cache, BRANCH) == (12, 14, 14)
    assert match(cache, PROMPT[:8] + [1, 2, 3, 4]) == (0, 8, 8)
    b = HybridReq("B", BRANCH)
    admit(cache, b)
    assert (b.prefix_len, b.swa_branching_seqlen) == (12, 14)
    prefill_done(cache, b, 777)  # inserts 14 of 16 tokens: [900] recovered with B's slot 19
    assert nodes(cache)[tuple(BRANCH[:13])] == ((19,), True, 1, 1)
    full_free, swa_free = frees(cache)
    assert (full_free[-2:], swa_free[-2:]) == ([13, 20], [13, 20])
    assert sizes(cache) == (4, 14, 5, 6)
    finish(cache, b)
    # an SWA eviction of an unlocked leaf deletes it whole; a FULL one cascades up the chain
    assert cache.evict(EvictParams(swa_num_tokens=4)).num_tokens_evicted == 4
    result = cache.evict(EvictParams(num_tokens=6))
    assert (result.num_tokens_evicted, result.swa_num_tokens_evicted) == (8, 8)
    assert mapping(cache) == {8: 8}
    assert frees(cache)[0][-8:] == [21, 22, 14, 19, 9, 10, 11, 12]


def test_interval_128_slides_nothing_in_six_steps():
    cache = build()
    a = HybridReq("A", PROMPT)
    admit(cache, a)
    prefill_done(cache, a, 900)
    for step in range(6):
        decode_step(cache, [a], 901 + step)  # SGLANG_SWA_EVICTION_INTERVAL's 128
    assert a.kv.get_evicted_seqlen("SWA") == 7
    finish(cache, a)
    assert sizes(cache) == (18, 0, 11, 0)
    assert match(cache, BRANCH) == (14, 14, None)


def test_paged_pools_page_in_step():
    cache = build(page_size=4)
    a = HybridReq("A", PROMPT)
    assert admit(cache, a).tolist() == list(range(4, 16))
    prefill_done(cache, a, 900)
    assert frees(cache)[1] == [1, 4, 5, 6, 7, 8]
    for step in range(6):
        decode_step(cache, [a], 901 + step, interval=1)
    assert all(mapping(cache)[16 + k] == 4 + k for k in range(4))  # independent page ids


def insert_fresh(cache: UnifiedRadixCache, tokens: list[int]):
    value = cache.token_to_kv_pool_allocator.alloc(len(tokens))
    return cache.insert(HybridInsertParams(key=RadixKey(tokens), value=value))


def test_internal_tombstones_window_locks_and_recovery():
    cache = build(swa=64)
    for n in (2, 4, 6, 10):
        insert_fresh(cache, list(range(1, n + 1)))
    result = cache.evict(EvictParams(swa_num_tokens=2))  # the LRU tail is internal: FULL kept
    assert (result.num_tokens_evicted, result.swa_num_tokens_evicted) == (0, 2)
    assert frees(cache)[1][-2:] == [1, 2]
    for probe, hit in (([1, 2, 99], 0), ([1, 2, 3, 99], 0), ([1, 2, 3, 4, 5, 99], 0),
                       ([1, 2, 3, 4, 5, 6, 99], 6), (list(range(1, 11)), 10)):
        assert match(cache, probe)[0] == hit
    found = cache.match_prefix(MatchPrefixParams(key=RadixKey(list(range(1, 11)))))
    lock = cache.lock(found.last_device_node)
    assert lock.receipt.component_lock_uuids["SWA"] is not None
    assert sizes(cache) == (0, 10, 4, 4)  # the window covers the last node only
    assert cache.evict(EvictParams(swa_num_tokens=2)).swa_num_tokens_evicted == 2
    second = cache.lock(cache.match_prefix(
        MatchPrefixParams(key=RadixKey(list(range(1, 9))))).last_device_node)
    assert sizes(cache)[3] == 6
    cache.release_swa(second)
    assert sizes(cache)[2:] == (2, 4)
    cache.unlock(second)
    cache.unlock(lock)
    assert sizes(cache) == (10, 0, 6, 0)
    value = cache.token_to_kv_pool_allocator.alloc(4)
    assert value.tolist() == [23, 24, 25, 26]
    result = cache.insert(HybridInsertParams(key=RadixKey([1, 2, 3, 4]), value=value))
    assert result.prefix_len == 4
    tree = nodes(cache)  # the tombstones took the incoming FULL ids; the old ones went free
    assert [tree[(1, 2)][0], tree[(1, 2, 3)][0], tree[(1, 2, 3, 4)][0]] == [(23, 24), (25,), (26,)]
    assert frees(cache)[0][-4:] == [1, 2, 5, 6]
    assert sizes(cache) == (10, 0, 10, 0)
    view = cache.engine.view
    lru = [view.nodes[n].key for n in reversed(swa_lru(view))]
    assert lru[:3] == [(4,), (3,), (1, 2)]


@pytest.mark.parametrize("page_size", [1, 4])
def test_allocator_frees_follow_sglang(page_size):
    cache = build(page_size=page_size)
    allocator = cache.token_to_kv_pool_allocator
    slots = allocator.alloc(3 * page_size)
    allocator.free(slots[page_size:].flip(0))  # page 1: the tail in order; pages: sorted, head
    full, swa = frees(cache)
    if page_size == 1:
        assert (full[-2:], swa[-2:]) == ([3, 2], [3, 2])
    else:
        assert (full[:2], swa[:2]) == ([2, 3], [2, 3])
    assert allocator.full_available_size() == 64 - page_size
    assert allocator.available_size() == allocator.swa_available_size() == 32 - page_size


@pytest.mark.parametrize("page_size", [1, 4])
def test_insert_refuses_values_it_cannot_own_and_changes_nothing(page_size):
    """An insert value must be whole pages in key order, held by one owner, outside the tree,
    each page once; anything else is a ValueError before the first event."""
    cache = build(page_size)
    allocator = cache.token_to_kv_pool_allocator
    tokens = list(range(300, 308))
    insert_fresh(cache, tokens)  # these slots now belong to the tree
    in_tree = [int(s) for s in cache.path_device_indices(
        cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens))).last_device_node)]
    fresh = [int(s) for s in allocator.alloc(8)]
    bad = [in_tree,  # pages the tree already holds
           fresh[:4] + fresh[:4]]  # one page twice
    if page_size > 1:
        bad.append([fresh[1], fresh[0], *fresh[2:8]])  # slots out of their page offsets
    key = list(range(500, 508))
    for value in bad:
        before = (cache.engine.seq, cache.engine.state.fingerprint())
        with pytest.raises(ValueError):
            cache.insert(HybridInsertParams(key=RadixKey(key), value=value))
        assert (cache.engine.seq, cache.engine.state.fingerprint()) == before
    done = cache.insert(HybridInsertParams(key=RadixKey(key), value=fresh))
    assert done.prefix_len == 0  # a good value still inserts
