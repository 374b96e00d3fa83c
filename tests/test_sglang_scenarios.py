"""SGLang scenarios (reference/sglang.md section 4 and the 0.5.23 notes), on kvstate.sglang."""

import pytest
import torch

from kvstate import InvalidEvent, check
from kvstate.planner import PlanBuilder, plan_evict
from kvstate.planner.alloc import plan_extend
from kvstate.sglang import Req
from tests.sglang_helpers import admit, build, decode_one


def values(tensor):
    return [int(v) for v in tensor]


def valid(cache):
    assert check(cache.state) == []


# 1
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("disable", [False, True])
def test_construction(page_size, disable):
    _, _, cache = build(page_size=page_size, disable=disable)
    assert cache.root_node.key == [] and cache.root_node.lock_ref == 1
    assert cache.total_size() == cache.evictable_size() == cache.protected_size() == 0
    valid(cache)


# 2
def test_reset_after_insert_returns_sizes_to_zero_and_frees_pages():
    _, allocator, cache = build(num_tokens=16)
    cache.insert([1, 2, 3])
    assert cache.total_size() == 3 and allocator.available_size() == 13
    cache.reset()
    assert (cache.total_size(), cache.evictable_size(), cache.protected_size()) == (0, 0, 0)
    assert allocator.available_size() == 16
    valid(cache)


# 3
def test_insert_then_match_exact_and_partial_values():
    _, allocator, cache = build()
    slots = allocator.alloc(3)
    assert cache.insert([1, 2, 3], slots) == 0
    assert (cache.total_size(), cache.evictable_size()) == (3, 3)
    assert values(cache.match_prefix([1, 2, 3])[0]) == values(slots)
    assert values(cache.match_prefix([1, 2])[0]) == values(slots)[:2]
    valid(cache)


def test_disabled_cache_stores_nothing():
    _, allocator, cache = build(disable=True)
    assert cache.insert([1, 2, 3], allocator.alloc(3)) == 0
    assert cache.total_size() == 0
    matched, node = cache.match_prefix([1, 2, 3])
    assert matched.numel() == 0 and node == cache.root_node


# 4 (deviation: value=None gets real slots, not the token ids)
def test_insert_without_value_allocates_real_slots():
    _, allocator, cache = build(num_tokens=16)
    cache.insert([7, 8, 9])
    matched, _ = cache.match_prefix([7, 8, 9])
    assert values(matched) == [1, 2, 3]
    assert allocator.available_size() == 13
    valid(cache)


# 5
def test_total_size_sums_disjoint_branches():
    _, _, cache = build()
    cache.insert([1, 2, 3])
    cache.insert([7, 8])
    assert cache.total_size() == 5


# 9
def test_lock_moves_tokens_between_evictable_and_protected():
    _, _, cache = build()
    cache.insert([1, 2, 3])
    _, leaf = cache.match_prefix([1, 2, 3])
    assert cache.inc_lock_ref(leaf).delta == -3
    assert (cache.evictable_size(), cache.protected_size()) == (0, 3)
    assert cache.dec_lock_ref(leaf).delta == 3
    assert (cache.evictable_size(), cache.protected_size()) == (3, 0)
    assert cache.inc_lock_ref(cache.root_node).delta == 0
    assert cache.dec_lock_ref(cache.root_node).delta == 0


# 10
def test_evict_two_leaves_frees_through_the_allocator():
    _, allocator, cache = build(num_tokens=16)
    cache.insert([1, 2])
    cache.insert([5, 6, 7])
    before = allocator.available_size()
    evicted = cache.evict(2)
    assert evicted >= 2
    assert cache.total_size() == 5 - evicted
    assert allocator.available_size() == before + evicted
    valid(cache)


# 11
@pytest.mark.parametrize("page_size,length", [(1, 5), (2, 5), (4, 6)])
def test_match_length_is_a_page_multiple(page_size, length):
    _, _, cache = build(num_tokens=64, page_size=page_size)
    cache.insert(list(range(1, 9)))
    matched, _ = cache.match_prefix(list(range(1, 1 + length)))
    assert len(matched) == length // page_size * page_size


# 12
@pytest.mark.parametrize("page_size", [1, 2])
def test_split_on_match_keeps_total_and_values(page_size):
    _, allocator, cache = build(num_tokens=64, page_size=page_size)
    seq1 = [1, 2, 3, 4, 5, 6, 7, 8]
    val1 = allocator.alloc(8)
    cache.insert(seq1, val1)
    cache.insert([1, 2, 30, 40], torch.cat([val1[:2], allocator.alloc(2)]))
    assert cache.total_size() == 10
    matched, node = cache.match_prefix([1, 2, 3, 4, 999, 998])
    assert values(matched) == values(val1)[:4] and len(node.key) == 2
    assert cache.total_size() == 10
    assert values(cache.match_prefix(seq1)[0]) == values(val1)
    matched, _ = cache.match_prefix([1, 2, 3, 4, 5, 6, 999, 998])
    assert values(matched) == values(val1)[:6] and cache.total_size() == 10
    valid(cache)


# 15
def test_insert_divergent_page_splits_into_one_page_node():
    _, allocator, cache = build(num_tokens=32, page_size=2)
    first = allocator.alloc(4)
    cache.insert([1, 2, 3, 4], first)
    cache.insert([1, 2, 5, 6], torch.cat([first[:2], allocator.alloc(2)]))
    top = cache.root_node.children[(1, 2)]
    assert top.key == [1, 2] and len(top.value) == 2
    assert sorted(child.key for child in top.children.values()) == [[3, 4], [5, 6]]
    valid(cache)


# 19
@pytest.mark.parametrize("page_size", [1, 4])
def test_unfinished_then_finished_leaves_no_lock(page_size):
    pool, allocator, cache = build(num_tokens=128, page_size=page_size)
    req = Req("a", list(range(1, 11)))
    admit(pool, allocator, cache, req)
    req.output_ids.append(50)
    cache.cache_unfinished_req(req)
    assert req.last_node.lock_ref == 1
    for token in (51, 52, 53):
        decode_one(pool, allocator, req, token)
    cache.cache_finished_req(req)
    assert cache.root_node.lock_ref == 1 and cache.protected_size() == 0
    assert req.req_pool_idx is None and pool.available_size() == 8
    valid(cache)


# 20
def test_retract_frees_everything_and_root_unlock_is_a_no_op():
    pool, allocator, cache = build(num_tokens=32)
    req = Req("a", [1, 2, 3, 4])
    admit(pool, allocator, cache, req)
    row = req.req_pool_idx
    allocator.free(pool.req_to_token[row, :4])  # release_kv_cache(is_insert=False)
    pool.free(row)
    assert cache.dec_lock_ref(req.last_node).delta == 0  # matched nothing: the root
    assert allocator.available_size() == 32 and cache.protected_size() == 0
    valid(cache)


# 21
def test_repeated_cycles_on_one_prefix_leak_no_locks():
    pool, allocator, cache = build(num_tokens=128)
    for i in range(5):
        req = Req(i, [1, 2, 3, 4, 5, 6])
        admit(pool, allocator, cache, req)
        req.output_ids.append(100 + i)
        cache.cache_unfinished_req(req)
        decode_one(pool, allocator, req, 200 + i)
        cache.cache_finished_req(req)
        assert cache.protected_size() == 0
    assert all(node.lock_ref == 0 for node in cache.root_node.children.values())
    assert pool.available_size() == 8
    valid(cache)


# 22
def test_budget_recheck_after_lock_releases_it():
    pool, allocator, cache = build(num_tokens=16)
    cache.insert([1, 2, 3, 4])
    _, node = cache.match_prefix([1, 2, 3, 4, 5])
    cache.inc_lock_ref(node)
    budget = allocator.available_size() + cache.evictable_size()
    assert budget < 100  # the request would need 100 tokens: give up
    cache.dec_lock_ref(node)
    assert (cache.evictable_size(), cache.protected_size()) == (4, 0)
    assert allocator.available_size() == 12


# 23
def test_lru_evicts_oldest_access_first():
    _, allocator, cache = build(num_tokens=32)
    cache.insert([1, 1])
    cache.insert([2, 2])
    cache.insert([3, 3])
    cache.match_prefix([1, 1])  # refresh [1, 1]
    cache.evict(2)
    assert [values(cache.match_prefix(k)[0]) != [] for k in ([1, 1], [2, 2], [3, 3])] == [True, False, True]


def test_fifo_policy_evicts_oldest_node_regardless_of_access():
    from kvstate.planner.evict import fifo_priority
    _, _, cache = build(num_tokens=32)
    cache.insert([1, 1])
    cache.insert([2, 2])
    cache.match_prefix([1, 1])
    builder = PlanBuilder(cache.state)
    plan_evict(builder, 2, at_head=False, priority=fifo_priority)
    assert builder.events[0].nodes == (1,)


# 36
@pytest.mark.parametrize("page_size", [8, 16, 32])
def test_alloc_extend_gates_on_the_exact_new_page_count(page_size):
    _, allocator, cache = build(num_tokens=4 * page_size, page_size=page_size)
    first = allocator.alloc_extend([0], [page_size + 1], [-1])  # 2 pages
    assert first is not None and allocator.available_size() == 2 * page_size
    last = int(first[-1])
    inside = allocator.alloc_extend([page_size + 1], [2 * page_size], [last])
    assert inside is not None and allocator.available_size() == 2 * page_size  # 0 new pages
    at_capacity = allocator.alloc_extend([0], [2 * page_size], [-1])
    assert at_capacity is not None and allocator.available_size() == 0
    fingerprint = cache.state.fingerprint()
    assert allocator.alloc_extend([0], [1], [-1]) is None
    assert cache.state.fingerprint() == fingerprint


# 38
def test_finish_frees_exactly_the_duplicate_range():
    pool, allocator, cache = build(num_tokens=64)
    a, b = Req("a", [1, 2, 3, 4, 5, 6]), Req("b", [1, 2, 3, 4, 5, 6])
    admit(pool, allocator, cache, a)
    admit(pool, allocator, cache, b)  # nothing cached yet: b computes all 6 again
    a.output_ids.append(9)
    b.output_ids.append(9)
    cache.cache_finished_req(a)
    assert allocator.available_size() == 64 - 12
    cache.cache_finished_req(b)  # b's 6 tokens are duplicates of a's
    assert allocator.available_size() == 64 - 6 and cache.total_size() == 6
    valid(cache)


# 41
def test_randomised_alloc_free_against_a_list_model():
    import random

    rng = random.Random(7)
    _, allocator, cache = build(num_tokens=40)
    model_free = list(range(1, 41))
    live: list[int] = []
    for _ in range(300):
        if live and rng.random() < 0.5:
            chunk = rng.sample(live, rng.randint(1, len(live)))
            allocator.free(torch.tensor(chunk))
            for slot in chunk:
                live.remove(slot)
            model_free.extend(chunk)
        else:
            n = rng.randint(1, 6)
            got = allocator.alloc(n)
            if n > len(model_free):
                assert got is None
                continue
            assert values(got) == model_free[:n]
            model_free = model_free[n:]
            live.extend(values(got))
        assert list(cache.state.free_pages) == model_free
    valid(cache)


def test_double_free_raises_and_changes_nothing():
    _, allocator, cache = build(num_tokens=8)
    slots = allocator.alloc(2)
    allocator.free(slots)
    fingerprint = cache.state.fingerprint()
    with pytest.raises(InvalidEvent, match="already free"):
        allocator.free(slots)
    with pytest.raises(InvalidEvent, match="duplicate"):
        allocator.free(torch.tensor([3, 3]))
    assert cache.state.fingerprint() == fingerprint


# 43
def test_empty_or_sub_page_match_returns_empty_int64_and_root():
    _, _, cache = build(page_size=4)
    for key in ([], [1, 2, 3]):
        matched, node = cache.match_prefix(key)
        assert matched.dtype == torch.int64 and matched.numel() == 0 and node == cache.root_node


# --- SGLang 0.5.23 specifics -------------------------------------------------
def test_rows_come_from_the_top_and_are_reused_lifo():
    pool, _, _ = build(rows=4)
    assert pool.alloc(2) == [3, 4]
    assert pool.alloc(1) == [2]
    pool.free(4)
    pool.free([3])
    assert pool.alloc(1) == [3]
    assert pool.alloc(1) == [4]
    assert pool.alloc(2) is None and pool.available_size() == 1


def test_token_allocator_is_fifo():
    _, allocator, _ = build(num_tokens=6)
    assert values(allocator.alloc(4)) == [1, 2, 3, 4]
    allocator.free(torch.tensor([3, 1]))
    assert values(allocator.alloc(4)) == [5, 6, 3, 1]


def test_paged_free_sorts_and_goes_to_the_head():
    _, allocator, cache = build(num_tokens=32, page_size=4)
    slots = allocator.alloc(24)  # pages 1..6
    allocator.free(torch.cat([slots[16:20], slots[4:8]]))  # pages 5 and 2
    assert list(cache.state.free_pages)[:3] == [2, 5, 7]
    assert values(allocator.alloc(4)) == [8, 9, 10, 11]


def test_eviction_frees_node_pages_in_node_order_and_last_node_is_reused_first():
    _, allocator, cache = build(num_tokens=64, page_size=2)
    cache.insert([1, 1, 2, 2])  # pages 1, 2
    cache.insert([3, 3, 4, 4])  # pages 3, 4
    cache.evict(8)
    assert list(cache.state.free_pages)[:4] == [3, 4, 1, 2]


def test_allocators_never_evict():
    _, allocator, cache = build(num_tokens=4)
    cache.insert([1, 2, 3, 4])
    assert allocator.available_size() == 0 and cache.evictable_size() == 4
    assert allocator.alloc(1) is None
    assert cache.total_size() == 4


def test_after_an_insert_split_the_old_remainder_is_evicted_first():
    _, _, cache = build(num_tokens=32)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 7, 8])  # splits [1,2,3,4]; [3,4] keeps the walk's time, [7,8] is later
    cache.evict(1)
    assert values(cache.match_prefix([1, 2, 7, 8])[0]) != [] and len(cache.match_prefix([1, 2, 7, 8])[0]) == 4
    assert len(cache.match_prefix([1, 2, 3, 4])[0]) == 2


def test_handle_survives_a_later_split_and_unlock_covers_the_prefix():
    _, _, cache = build(num_tokens=32)
    cache.insert([1, 2, 3, 4])
    _, leaf = cache.match_prefix([1, 2, 3, 4])
    cache.inc_lock_ref(leaf)
    cache.match_prefix([1, 2, 9])  # splits the locked node at 2
    assert leaf.key == [3, 4] and leaf.parent.key == [1, 2] and leaf.parent.lock_ref == 1
    assert cache.dec_lock_ref(leaf).delta == 4
    assert cache.protected_size() == 0
    valid(cache)


def test_eviction_overshoots_and_cascades_to_the_parent():
    _, allocator, cache = build(num_tokens=32)
    cache.insert([1, 2, 3])
    cache.insert([1, 2, 3, 4, 5, 6])
    assert cache.evict(4) == 6  # leaf [4,5,6] (3 tokens), then its parent [1,2,3]
    assert cache.total_size() == 0 and allocator.available_size() == 32


def test_backup_and_restore_are_exact_and_keep_interleaved_frees():
    _, allocator, cache = build(num_tokens=16)
    kept = allocator.alloc(2)
    backup = allocator.backup_state()
    allocator.alloc(3)
    allocator.restore_state(backup)
    assert cache.state.free_pages == backup.state.free_pages or list(cache.state.free_pages) == list(
        backup.state.free_pages)
    backup = allocator.backup_state()
    allocator.alloc(3)
    allocator.free(kept)  # a free between backup and restore is not lost
    allocator.restore_state(backup)
    assert allocator.available_size() == 16
    valid(cache)


def test_free_group_is_one_sorted_free_and_invisible_until_it_ends():
    _, allocator, cache = build(num_tokens=32, page_size=4)
    slots = allocator.alloc(16)  # pages 1..4
    allocator.free_group_begin()
    allocator.free(slots[12:16])
    allocator.free(slots[0:4])
    assert allocator.available_size() == 16
    allocator.free_group_end()
    assert allocator.available_size() == 24
    assert list(cache.state.free_pages)[:2] == [1, 4]


def test_scheduler_flow_evicts_exactly_the_deficit_or_changes_nothing():
    pool, allocator, cache = build(num_tokens=8)
    cache.insert([1, 1])
    cache.insert([2, 2])
    cache.insert([3, 3])
    row = pool.alloc(1)[0]
    # 2 free slots; extending the row by 4 needs a 2-slot deficit: exactly one node goes.
    builder = PlanBuilder(cache.state)
    assert plan_extend(builder, [(row, 4)], at_head=False) is not None
    assert builder.state.total_size() == 4
    refused = PlanBuilder(cache.state)
    assert plan_extend(refused, [(row, 9)], at_head=False) is None and refused.events == []
