"""Frees under a live row (SGLang 0.5.23's finish and checkpoint order): ``FreeMapped``.

0.5.23 calls ``allocator.free`` on slots a request's row still maps (the
duplicates after ``insert``, the unaligned tail on finish), then rewrites or
frees the row.  Those entries are dangling in between; the next write or
free of the row releases them.  Every step keeps ``kvstate.check`` clean.
"""

import pytest
import torch

from kvstate import InvalidEvent, check
from kvstate.events import Free, FreeMapped
from kvstate.sglang import InsertParams, MatchPrefixParams, RadixKey, Req
from tests.sglang_helpers import admit, build, unchanged


def valid(pool):
    assert check(pool.state) == [] and pool.verify() == []


def dangling(pool, req):
    return pool.state.requests[req.req_pool_idx].dangling


def finish_by_primitives(pool, allocator, cache, req, owned):
    """0.5.23's checkpoint + release, one primitive call at a time, checking after each."""
    size = cache.page_size
    row, protected = req.req_pool_idx, req.cache_protected_len
    aligned = owned // size * size
    kv = pool.req_to_token[row, :owned].to(torch.int64)
    key = RadixKey(req.origin_input_ids + req.output_ids)
    result = cache.insert(InsertParams(key=RadixKey(key.token_ids[:aligned]), value=kv[:aligned]))
    allocator.free_segment(kv[protected:result.prefix_len], start_pos=protected)  # duplicates
    valid(pool)
    duplicates = dangling(pool, req)
    matched = cache.match_prefix(MatchPrefixParams(key=RadixKey(key.token_ids[:aligned])))
    new_slots = cache.path_device_indices(matched.last_device_node)
    pool.write((row, slice(protected, aligned)), new_slots[protected:])  # releases the duplicates
    assert dangling(pool, req) == ()
    cache.dec_lock_ref(req.last_node)
    cache.inc_lock_ref(matched.last_device_node)
    req.last_node, req.cache_protected_len = matched.last_device_node, aligned
    cache.free_kv_row(req, [(aligned, owned)])  # the unaligned tail, still in the row
    valid(pool)
    tail = dangling(pool, req)
    cache.dec_lock_ref(req.last_node)
    pool.free(req)
    valid(pool)
    return duplicates, tail


@pytest.mark.parametrize("page_size", [1, 4])
def test_two_concurrent_requests_with_one_prompt(page_size):
    pool, allocator, cache = build(num_tokens=128, page_size=page_size)
    prompt = list(range(1, 11))
    a, b = Req("a", prompt), Req("b", prompt)
    admit(pool, allocator, cache, a)
    admit(pool, allocator, cache, b)  # nothing cached yet: b computes the prompt again
    a.output_ids.append(7)
    b.output_ids.append(7)
    assert finish_by_primitives(pool, allocator, cache, a, 10)[0] == ()  # a inserts first
    duplicates, tail = finish_by_primitives(pool, allocator, cache, b, 10)
    assert len(duplicates) == 10 // page_size  # b's whole aligned prompt duplicates a's
    assert len(tail) == (1 if 10 % page_size else 0)
    assert FreeMapped in {type(e) for e in cache.events}
    assert cache.total_size() == 10 // page_size * page_size
    assert allocator.available_size() + cache.total_size() == 128
    assert pool.available_size() == 8


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_bare_insert_over_a_running_requests_prefix(page_size):
    """The duplicates sit in the middle of the row (the row keeps its own last page)."""
    pool, allocator, cache = build(num_tokens=128, page_size=page_size)
    req = Req("r", list(range(1, 11)))
    admit(pool, allocator, cache, req)
    cache.insert(req.origin_input_ids)  # someone caches the same prompt with other slots
    req.output_ids.extend([20, 21])
    duplicates, _ = finish_by_primitives(pool, allocator, cache, req, 10)
    assert duplicates == tuple(range(10 // page_size))
    assert allocator.available_size() + cache.total_size() == 128


def test_the_high_level_checkpoint_flow_frees_the_tail_under_the_row():
    pool, allocator, cache = build(num_tokens=64, page_size=4)
    req = Req("r", list(range(1, 11)))
    admit(pool, allocator, cache, req)
    req.output_ids.append(5)
    req.lock = cache.lock(req.last_node)
    cache.dec_lock_ref(req.last_node)  # admit's lock, now held through req.lock
    cache.checkpoint(req, up_to=10)
    cache.free_kv_row(req, [(req.cache_protected_len, 10)])
    assert isinstance(cache.events[-1], FreeMapped) and dangling(pool, req) == (2,)
    valid(pool)
    with unchanged(pool), pytest.raises(ValueError, match="freed pages"):
        cache.cache_finished_req(req)  # would read the freed tail: refused
    cache.unlock(req.lock)
    pool.free(req)
    valid(pool)
    assert cache.total_size() == 8 and allocator.available_size() == 56


def test_a_freed_entry_stays_in_the_row_until_rewritten():
    """No truncation: the row keeps its length; rewriting the position releases the entry."""
    pool, allocator, cache = build(num_tokens=16)
    req = Req("r", [1, 2, 3])
    admit(pool, allocator, cache, req)
    row = req.req_pool_idx
    allocator.free(pool.req_to_token[row, 1:2].to(torch.int64))
    record = pool.state.requests[row]
    assert record.allocated == 3 and record.dangling == (1,)
    pool.write((row, 1), allocator.alloc(1))
    assert pool.state.requests[row].dangling == ()
    valid(pool)


def test_one_free_mixing_row_pages_and_bare_pages_keeps_sglangs_order():
    pool, allocator, cache = build(num_tokens=16)
    req = Req("r", [1, 2])
    admit(pool, allocator, cache, req)  # slots 1, 2 in the row
    bare = allocator.alloc(2)  # slots 3, 4, never written
    allocator.free(torch.tensor([3, 1, 4, 2]))  # the tail, in the order given
    assert [type(e) for e in cache.events[-4:]] == [Free, FreeMapped, Free, FreeMapped]
    assert list(cache.state.free_pages)[-4:] == [3, 1, 4, 2] and bare.tolist() == [3, 4]
    paged_pool, paged, paged_cache = build(num_tokens=32, page_size=4)
    req = Req("p", list(range(1, 9)))
    admit(paged_pool, paged, paged_cache, req)  # pages 1, 2
    paged.alloc(8)  # pages 3, 4
    paged.free(torch.tensor([17, 5, 13, 9]))  # pages 4, 1, 3, 2: sorted, at the head
    assert list(paged_cache.state.free_pages)[:4] == [1, 2, 3, 4]
    valid(paged_pool)


def test_frees_that_are_not_sglangs_are_refused():
    pool, allocator, cache = build(num_tokens=32)
    a = Req("a", [1, 2, 3])
    admit(pool, allocator, cache, a)
    a.output_ids.append(4)
    cache.cache_unfinished_req(a)  # a's row now maps tree slots it does not hold
    tree_slots = pool.req_to_token[a.req_pool_idx, :3].to(torch.int64)
    with unchanged(pool), pytest.raises(InvalidEvent, match="tree node"):
        allocator.free(tree_slots)
    b = Req("b", [9])
    admit(pool, allocator, cache, b)
    own = pool.req_to_token[b.req_pool_idx, :1].to(torch.int64)
    allocator.free(own)
    with unchanged(pool), pytest.raises(InvalidEvent, match="already free"):
        allocator.free(own)  # a dangling entry's slot is free: freeing it again is a double free
