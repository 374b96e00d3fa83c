"""SGLang 0.5.23's call forms (parameter and result objects) beside the plain seed-000 forms."""

import dataclasses
from array import array

import pytest
import torch

from kvstate import check
from kvstate.events import Lock, Touch, Unlock
from kvstate.sglang import (
    CacheInitParams,
    DecLockRefResult,
    EvictParams,
    EvictResult,
    IncLockRefResult,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
    MatchResult,
    PagedTokenToKVPoolAllocator,
    RadixCache,
    RadixKey,
    Req,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
    TreeLock,
)
from tests.sglang_helpers import build, unchanged


def test_field_names_are_0523s():
    assert MatchResult._fields[:5] == ("device_prefix_len", "last_device_node", "last_host_node",
                                       "best_match_node", "host_hit_length")
    names = {cls: [f.name for f in dataclasses.fields(cls)] for cls in (
        InsertResult, EvictParams, EvictResult, IncLockRefResult, DecLockRefResult, TreeLock)}
    assert names[InsertResult][:3] == ["prefix_len", "total_len", "last_device_node"]
    assert names[EvictParams] == ["num_tokens", "swa_num_tokens", "mamba_num"]
    assert names[EvictResult][0] == "num_tokens_evicted"
    assert names[IncLockRefResult][:2] == ["delta", "node_id"]
    assert names[DecLockRefResult] == ["delta"] and names[TreeLock] == ["node", "receipt"]
    assert [f.name for f in dataclasses.fields(InsertParams)][:2] == ["key", "value"]


@pytest.mark.parametrize("page_size", [1, 4])
def test_match_prefix_params_form_equals_the_plain_form(page_size):
    _, _, cache = build(num_tokens=64, page_size=page_size)
    cache.insert(list(range(1, 13)))
    result = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", range(1, 10)))))
    slots, node = cache.match_prefix(list(range(1, 10)))
    assert isinstance(result, MatchResult)
    assert result.device_prefix_len == len(slots) == 9 // page_size * page_size
    assert result.last_device_node == result.last_host_node == result.best_match_node == node
    path = cache.path_device_indices(result.last_device_node)
    assert path.dtype == torch.int64 and path.tolist() == slots.tolist()
    assert result.host_hit_length == 0 and result.mamba_branching_seqlen is None


def test_radix_key_limit_and_namespaces():
    _, _, cache = build(num_tokens=32)
    cache.insert([1, 2, 3, 4])
    assert cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 4], limit=3))).device_prefix_len == 3
    pool = cache.req_to_token_pool
    for key in (RadixKey([1, 2], extra_key="lora"), RadixKey([1, 2], cache_salt="s"),
                RadixKey([1, 2], is_bigram=True)):
        with unchanged(pool), pytest.raises(ValueError):
            cache.match_prefix(MatchPrefixParams(key=key))
    for limit in ("3", 1.5, True):  # a limit that is not an int is named, before any compare
        with unchanged(pool), pytest.raises(TypeError, match="RadixKey.limit must be an int"):
            cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 4], limit=limit)))


def test_insert_and_evict_params_forms():
    _, allocator, cache = build(num_tokens=32, page_size=2)
    value = allocator.alloc(6)
    first = cache.insert(InsertParams(key=RadixKey([1, 2, 3, 4, 5, 6, 7]), value=value))
    assert isinstance(first, InsertResult) and first.prefix_len == 0
    assert first.last_device_node.key == [1, 2, 3, 4, 5, 6]
    again = cache.insert(InsertParams(key=RadixKey([1, 2, 3, 4]), value=allocator.alloc(4)))
    assert again.prefix_len == 4 and again.last_device_node.key == [1, 2, 3, 4]  # split
    evicted = cache.evict(EvictParams(num_tokens=1))
    assert isinstance(evicted, EvictResult) and evicted.num_tokens_evicted == 2
    assert cache.evict(3) == 4  # the plain form: an int


def test_lock_results_and_tree_locks():
    _, _, cache = build(num_tokens=32)
    cache.insert([1, 2, 3])
    _, leaf = cache.match_prefix([1, 2, 3])
    result = cache.inc_lock_ref(leaf)
    assert result == IncLockRefResult(delta=-3, node_id=leaf.id)
    assert isinstance(cache.events[-1], Lock)
    assert cache.dec_lock_ref(leaf, result.to_dec_params()) == DecLockRefResult(delta=3)
    lock = cache.lock(leaf)
    assert isinstance(lock, TreeLock) and lock.node == leaf and cache.protected_size() == 3
    cache.unlock(lock)
    cache.unlock(None)  # nothing held: nothing happens
    assert isinstance(cache.events[-1], Unlock) and cache.protected_size() == 0
    assert cache.lock(cache.root_node).receipt.node_id == 0 and not isinstance(
        cache.events[-1], Lock)  # the root is locked forever: no event


def test_cache_init_params_constructor_and_fifo_policy():
    pool = ReqToTokenPool(4, 32, "cpu", False)
    allocator = TokenToKVPoolAllocator(32, torch.float16, "cpu", None, False)
    cache = RadixCache(CacheInitParams(req_to_token_pool=pool, token_to_kv_pool_allocator=allocator,
                                       page_size=1, eviction_policy="fifo"))
    cache.insert([1, 1])
    cache.insert([2, 2])
    cache.match_prefix([1, 1])  # LRU would now evict [2, 2]; FIFO evicts the older [1, 1]
    cache.evict(1)
    assert len(cache.match_prefix([1, 1])[0]) == 0 and len(cache.match_prefix([2, 2])[0]) == 2
    with pytest.raises(ValueError, match="eviction_policy"):
        RadixCache(CacheInitParams(req_to_token_pool=pool, token_to_kv_pool_allocator=allocator,
                                   eviction_policy="lfu"))


def test_paged_allocator_0523_forms_equal_the_plain_forms():
    results = []
    for form in ("plain", "0523"):
        ReqToTokenPool(2, 32)
        allocator = PagedTokenToKVPoolAllocator(64, 4)
        prefix, seq, last = torch.tensor([0, 0]), torch.tensor([5, 9]), torch.tensor([-1, -1])
        if form == "plain":
            out = allocator.alloc_extend(prefix, seq, last, 14)
            decode = allocator.alloc_decode(torch.tensor([6, 10]), out[[4, 13]])
        else:
            out = allocator.alloc_extend(prefix, prefix, seq, seq, last, 14, 5)
            decode = allocator.alloc_decode(torch.tensor([6, 10]), torch.tensor([6, 10]), out[[4, 13]])
        results.append((out.tolist(), decode.tolist(), list(allocator.state.free_pages)))
    assert results[0] == results[1]
    with pytest.raises(TypeError, match="alloc_extend takes"):
        allocator.alloc_extend(prefix, seq)
    with pytest.raises(ValueError, match="num_new_pages"):
        allocator.alloc_extend(prefix, prefix, seq, seq, last, 14, 4)


def test_pool_row_forms():
    pool, _, cache = build(rows=4)
    rows = pool.alloc_rows(2)
    assert rows == [3, 4]
    req = Req("r", [1])
    req.req_pool_idx = rows[0]
    pool.free(req)
    assert req.req_pool_idx is None
    pool.free_rows([4])
    assert pool.alloc(1) == [4] and pool.available_size() == 3
    assert check(cache.state) == []


def test_match_touches_without_a_hit_and_a_short_key_emits_nothing():
    _, _, cache = build(num_tokens=32, page_size=4)
    before = len(cache.events)
    assert cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3]))).device_prefix_len == 0
    assert len(cache.events) == before
    cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 4])))
    assert [type(e) for e in cache.events[before:]] == [Touch]
