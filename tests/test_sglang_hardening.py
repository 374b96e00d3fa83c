"""Regression tests for reported defects: every rejected call is refused with a clear error
and leaves the state (fingerprint) and ``req_to_token`` exactly as they were.

The first five tests fail on the code before the core rebuild (run them with
``PYTHONPATH`` pointing at a ``git worktree`` of that commit): there
``pool.alloc(1.5)`` returned rows, ``free(None)`` failed inside the list
conversion, ``cache_finished_req`` on a never-allocated row raised a bare
``KeyError``, ``write`` ignored a slice step, and a token id of 2**64 was
inserted and later broke ``fingerprint()``.
"""

from array import array
from functools import partial

import pytest
import torch

from kvstate import InvalidEvent, check
from kvstate.sglang import Req
from tests.sglang_helpers import admit, build, unchanged


def test_alloc_takes_only_a_row_count():
    pool, _, _ = build(rows=4)
    for bad, error in ((1.5, TypeError), (True, TypeError), ("2", TypeError), (None, TypeError),
                       (-1, ValueError)):
        with unchanged(pool), pytest.raises(error):
            pool.alloc(bad)
    assert pool.available_size() == 4


def test_free_none_is_a_clear_type_error():
    pool, allocator, _ = build(rows=4)
    pool.alloc(1)
    with unchanged(pool), pytest.raises(TypeError, match="got None"):
        pool.free(None)
    with unchanged(pool), pytest.raises(TypeError, match="got None"):
        allocator.free(None)


def test_finishing_a_request_whose_row_was_never_allocated():
    pool, _, cache = build(rows=4)
    req = Req("r", [1, 2, 3], [4])
    req.req_pool_idx = 2
    with unchanged(pool), pytest.raises(ValueError, match="not allocated"):
        cache.cache_finished_req(req)


def test_write_refuses_a_slice_step():
    pool, allocator, _ = build(num_tokens=16, rows=4, width=16)
    row = pool.alloc(1)[0]
    slots = allocator.alloc(4)
    with unchanged(pool), pytest.raises(ValueError, match="step"):
        pool.write((row, slice(0, 8, 2)), slots)


def test_token_ids_must_be_int64_ids():
    pool, _, cache = build(num_tokens=16)
    for key in ([2**64, 1], [-1, 1], [1.0, 2.0], [True, 2], torch.tensor([1.5]), array("q", [-1, 2])):
        with unchanged(pool), pytest.raises((TypeError, ValueError)):
            cache.insert(key)
        with unchanged(pool), pytest.raises((TypeError, ValueError)):
            cache.match_prefix(key)
    cache.insert([2**63 - 1, 0])  # the extremes of the range are fine
    assert len(cache.match_prefix([2**63 - 1, 0])[0]) == 2
    assert len(cache.state.fingerprint()) == 16 and check(cache.state) == []


def _running(page_size=1):
    pool, allocator, cache = build(num_tokens=32, page_size=page_size, rows=4, width=32)
    req = Req("r", [1, 2, 3, 4, 5, 6])
    admit(pool, allocator, cache, req)
    req.output_ids.append(7)
    cache.cache_unfinished_req(req)
    return pool, allocator, cache, req


def _other_cache_node():
    _, _, other = build()
    other.insert([1])
    return other.match_prefix([1])[1]


# Each entry prepares its arguments (which may commit events) and returns the call to refuse.
REFUSED = {
    "alloc: a float": lambda p, a, c, r: partial(a.alloc, 2.0),
    "alloc: negative": lambda p, a, c, r: partial(a.alloc, -4),
    "free: a tree slot": lambda p, a, c, r: partial(a.free, p.req_to_token[r.req_pool_idx, :1].long()),
    "free: one slot twice": lambda p, a, c, r: partial(a.free, torch.tensor([30, 30])),
    "free: a float tensor": lambda p, a, c, r: partial(a.free, torch.tensor([1.0])),
    "free_segment: negative start": lambda p, a, c, r: partial(a.free_segment, torch.tensor([1]),
                                                               start_pos=-1),
    "insert: a value nobody holds": lambda p, a, c, r: partial(c.insert, [9, 9], torch.tensor([30, 31])),
    "insert: a value too short": lambda p, a, c, r: partial(c.insert, [9, 9, 9], a.alloc(2)),
    "insert: tree slots as value": lambda p, a, c, r: partial(c.insert, [8, 8],
                                                              c.match_prefix([1, 2])[0]),
    "evict: negative": lambda p, a, c, r: partial(c.evict, -1),
    "evict: a float": lambda p, a, c, r: partial(c.evict, 1.5),
    "dec_lock_ref: below zero": lambda p, a, c, r: (c.insert([5, 5]), partial(
        c.dec_lock_ref, c.match_prefix([5, 5])[1]))[1],
    "inc_lock_ref: another cache's node": lambda p, a, c, r: partial(c.inc_lock_ref,
                                                                     _other_cache_node()),
    "checkpoint: up_to past the tokens": lambda p, a, c, r: partial(c.checkpoint, r, up_to=9),
    "checkpoint: up_to past the row": lambda p, a, c, r: partial(c.checkpoint, r, up_to=7),
    "free_kv_row: past the row": lambda p, a, c, r: partial(c.free_kv_row, r, [(6, 8)]),
    "free_kv_row: overlapping": lambda p, a, c, r: partial(c.free_kv_row, r, [(0, 3), (2, 4)]),
    "pool.free: a free row": lambda p, a, c, r: partial(p.free, [1]),
    "pool.free: row 0": lambda p, a, c, r: partial(p.free, 0),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_every_refused_call_changes_nothing(case):
    pool, allocator, cache, req = _running()
    call = REFUSED[case](pool, allocator, cache, req)
    with unchanged(pool), pytest.raises((TypeError, ValueError, InvalidEvent)):
        call()


def test_a_request_flow_is_checked_before_its_first_event():
    """A finish whose lock is gone would fail half-way through its batch: refused up front."""
    pool, _, cache, req = _running()
    cache.dec_lock_ref(req.last_node)  # the caller already released the request's lock
    with unchanged(pool), pytest.raises(ValueError, match="holds no lock"):
        cache.cache_finished_req(req)
    req.cache_protected_len = 3  # not a page-aligned tree prefix of the row any more (P = 1: fine)
    cache.inc_lock_ref(req.last_node)
    req.cache_protected_len = 99
    with unchanged(pool), pytest.raises(ValueError, match="tree prefix"):
        cache.checkpoint(req, up_to=6)


def test_a_refused_paged_extend_or_decode_changes_nothing():
    pool, allocator, _ = build(num_tokens=32, page_size=4)
    cases = [lambda: allocator.alloc_extend([2], [5], [7]),  # last_loc off its page position
             lambda: allocator.alloc_extend([0, 0], [4], [-1]),  # lengths differ
             lambda: allocator.alloc_extend([0], [4], [-1], 5),  # extend_num_tokens wrong
             lambda: allocator.alloc_extend([4], [2], [3]),  # shrinking
             lambda: allocator.alloc_decode([5], [5]),  # last_loc off its page position
             lambda: allocator.alloc(3)]  # not whole pages
    for call in cases:
        with unchanged(pool), pytest.raises((TypeError, ValueError)):
            call()
    with unchanged(pool):
        assert allocator.alloc_extend([0], [64], [-1]) is None  # too big: None, no event


@pytest.mark.parametrize("swa", [False, True])
def test_alloc_decode_refuses_a_last_loc_outside_the_pool(swa: bool) -> None:
    from kvstate.sglang.allocator import PagedTokenToKVPoolAllocator
    from kvstate.sglang.swa_allocator import SWATokenToKVPoolAllocator

    allocator = (SWATokenToKVPoolAllocator(64, 32, 4) if swa
                 else PagedTokenToKVPoolAllocator(64, 4))
    allocator.alloc(8)
    before = allocator.engine.view.fingerprint()
    for seq_lens, last_loc in (([10**9], [10**9 - 2]), ([10**9 + 1], [10**9 - 1])):
        with pytest.raises(ValueError, match="last_loc"):
            allocator.alloc_decode(seq_lens, last_loc)
        assert allocator.engine.view.fingerprint() == before


@pytest.mark.parametrize("swa", [False, True])
def test_alloc_extend_refuses_a_last_loc_outside_the_pool(swa: bool) -> None:
    from kvstate.sglang.allocator import PagedTokenToKVPoolAllocator
    from kvstate.sglang.swa_allocator import SWATokenToKVPoolAllocator

    allocator = (SWATokenToKVPoolAllocator(32, 32, 4) if swa
                 else PagedTokenToKVPoolAllocator(32, 4))
    before = allocator.engine.view.fingerprint()
    with pytest.raises(ValueError, match="last_loc"):
        allocator.alloc_extend([2], [5], [4001])  # as alloc_decode refuses it
    assert allocator.engine.view.fingerprint() == before
    if not swa:
        assert allocator.alloc_extend([2], [5], [5]).tolist() == [6, 7, 4]


def test_lock_refs_take_only_int_node_ids():
    import numpy as np

    from kvstate import apply_all
    from kvstate.sglang import TreeNode

    pool, _, cache = build()
    cache.insert([1, 2, 3])
    node_id = cache.match_prefix([1, 2, 3])[1].id
    for bad in (float(node_id), True):
        with unchanged(pool), pytest.raises(TypeError, match="tree node id"):
            cache.inc_lock_ref(TreeNode(cache, bad))
    cache.inc_lock_ref(TreeNode(cache, np.int64(node_id)))  # a numpy int is an int
    cache.dec_lock_ref(TreeNode(cache, np.int64(node_id)))
    assert all(type(event.node) is int for event in cache.events if hasattr(event, "node"))
    assert apply_all(cache.engine.initial_state, cache.events).fingerprint() == \
        cache.state.fingerprint()


def test_a_hybrid_receipt_takes_only_int_ids():
    import numpy as np

    from kvstate.sglang.hybrid_req import SWA, HybridLock, HybridReceipt

    for receipt in (HybridReceipt(1.5), HybridReceipt(True),
                    HybridReceipt(2, {SWA: 2.0})):
        with pytest.raises(TypeError):
            HybridLock(None, receipt).planned()
    planned = HybridLock(None, HybridReceipt(np.int64(2), {SWA: np.int64(3)})).planned()
    assert (type(planned.node), type(planned.uuid)) == (int, int)


def test_a_refused_clear_keeps_the_open_free_group() -> None:
    pool, allocator, _ = build(num_tokens=16)
    full = allocator.available_size()
    held = allocator.alloc(2)
    pool.alloc(1)  # an open row: the reset is refused
    allocator.free_group_begin()
    allocator.free(held)
    fingerprint = allocator.engine.state.fingerprint()
    with pytest.raises(InvalidEvent):
        allocator.clear()
    assert allocator.engine.state.fingerprint() == fingerprint
    allocator.free_group_end()  # the group is still open, with the slots it parked
    assert allocator.available_size() == full


@pytest.mark.parametrize("swa", [False, True])
@pytest.mark.parametrize("page_size", [1, 4])
def test_a_bad_free_inside_a_free_group_is_refused_when_it_is_parked(swa: bool,
                                                                     page_size: int) -> None:
    from kvstate.sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
    from kvstate.sglang.swa_allocator import SWATokenToKVPoolAllocator

    if swa:
        allocator = SWATokenToKVPoolAllocator(32, 32, page_size)
    elif page_size == 1:
        allocator = TokenToKVPoolAllocator(32)
    else:
        allocator = PagedTokenToKVPoolAllocator(32, page_size)
    full = allocator.available_size()
    first, second = allocator.alloc(page_size), allocator.alloc(page_size)
    allocator.free_group_begin()
    allocator.free(second)
    allocator.free(first)
    fingerprint = allocator.engine.state.fingerprint()
    bad = [torch.tensor([31 * page_size])]  # never allocated
    if page_size == 1:  # a slot freed twice (paged: a page a free touches again is freed once)
        bad += [first[:1], torch.tensor([int(first[0]), int(first[0])])]
    else:
        allocator.free(first[1:])  # its page is parked already: accepted, freed once at the end
    for slots in bad:
        with pytest.raises((InvalidEvent, ValueError)):
            allocator.free(slots)
        assert allocator.engine.state.fingerprint() == fingerprint
    allocator.free_group_end()  # the good frees, nothing of the refused ones
    assert allocator.available_size() == full
    assert check(allocator.engine.state) == []


def test_restore_state_takes_only_a_backup_of_its_own_engine():
    pool, allocator, _ = build(num_tokens=16)
    other = build(num_tokens=16)[1]
    allocator.alloc(4)
    with unchanged(pool), pytest.raises(ValueError, match="this allocator's engine"):
        allocator.restore_state(other.backup_state())
    backup = allocator.backup_state()
    allocator.alloc(2)
    allocator.restore_state(backup)
    assert allocator.available_size() == 12
