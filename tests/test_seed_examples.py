"""The worked examples of seeds 000 and 001, on kvstate.sglang."""

import torch

from kvstate import check
from kvstate.sglang import Req
from tests.sglang_helpers import admit, build, decode_one


def test_seed_001_walkthrough_prefix_hit_then_two_new_slots():
    """req_0: a 5-token prompt hits cached slots [42, 17, 88] and takes 2 new slots [5, 9]."""
    pool, allocator, cache = build(num_tokens=88, rows=4, width=16)
    everything = allocator.alloc(88)
    assert [int(s) for s in everything[:3]] == [1, 2, 3]
    # An earlier request left tokens [11, 12, 13] cached in slots 42, 17, 88.
    cache.insert([11, 12, 13], torch.tensor([42, 17, 88]))
    # Everything else goes back, 5 and 9 first, so they head the FIFO free list.
    rest = [s for s in range(1, 89) if s not in (42, 17, 88, 5, 9)]
    allocator.free(torch.tensor([5, 9] + rest))

    req = Req("req_0", [11, 12, 13, 14, 15])
    row = pool.alloc(1)[0]
    req.req_pool_idx = row
    hit, last_node = cache.match_prefix(req.origin_input_ids)
    assert hit.tolist() == [42, 17, 88]
    pool.write((row, slice(0, 3)), hit)
    assert pool.req_to_token[row, :5].tolist() == [42, 17, 88, 0, 0]
    new = allocator.alloc(2)
    assert new.tolist() == [5, 9]
    pool.write((row, slice(3, 5)), new)
    assert pool.req_to_token[row, :5].tolist() == [42, 17, 88, 5, 9]
    assert 5 not in cache.state.free_pages and 9 not in cache.state.free_pages
    assert pool.req_to_token.dtype == torch.int32 and pool.req_to_token.shape == (5, 16)
    assert check(cache.state) == []


def test_seed_000_request_lifecycle_prefill_unfinished_decode_finished():
    """Prefill -> cache_unfinished_req -> decode -> cache_finished_req, then a second request hits."""
    pool, allocator, cache = build(num_tokens=32, rows=4, width=32)
    first = Req("r1", [1, 2, 3, 4, 5])
    admit(pool, allocator, cache, first)
    first.output_ids.append(6)
    cache.cache_unfinished_req(first)
    assert cache.total_size() == 5 and cache.protected_size() == 5
    decode_one(pool, allocator, first, 7)
    decode_one(pool, allocator, first, 8)
    cache.cache_finished_req(first)
    # (input + output)[:-1] = [1..7] is cached; the row is free and nothing is locked.
    assert cache.total_size() == 7 and cache.protected_size() == 0
    assert allocator.available_size() == 32 - 7
    assert pool.available_size() == 4

    second = Req("r2", [1, 2, 3, 4, 5, 6, 9])
    admit(pool, allocator, cache, second)
    assert len(second.prefix_indices) == 6 and second.extend_input_len == 1
    assert check(cache.state) == []


def test_a_write_that_bypasses_pool_write_is_reported():
    """req_to_token is a plain tensor (kernels take it as is); verify() catches stray writes
    to mapped positions.  Past a row's end nothing is mapped, as in SGLang, so nothing is read."""
    pool, allocator, _ = build()
    row = pool.alloc(1)[0]
    pool.write((row, slice(0, 3)), allocator.alloc(3))
    assert pool.verify() == []
    pool.req_to_token[row, 5] = 7  # past the row's 3 mapped positions
    assert pool.verify() == []
    pool.req_to_token[row, 1] = 7
    (problem,) = pool.verify()
    assert f"row {row} position 1" in problem.message and "bypassed" in problem.message
