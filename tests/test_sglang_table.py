"""``ReqToTokenPool.req_to_token`` is a real int32 tensor that always equals the state."""

import pytest
import torch

from kvstate import InvalidEvent, check
from kvstate.events import Allocate
from kvstate.planner.alloc import plan_decode, plan_extend
from kvstate.sglang import Req
from kvstate.state import slots_of
from tests.sglang_helpers import admit, build, decode_one, unchanged


def rows_equal_state(pool):
    state = pool.state
    for row, record in state.requests.items():
        assert pool.req_to_token[row, : record.allocated].tolist() == slots_of(state, row)
    assert pool.verify() == []


def test_req_to_token_is_the_int32_table_kernels_take():
    pool, _, _ = build(rows=4, width=32)
    table = pool.req_to_token
    assert type(table) is torch.Tensor and table.dtype == torch.int32
    assert table.shape == (5, 32) and table is pool.req_to_token
    rows = torch.tensor([1, 2])
    assert table[rows, torch.tensor([0, 3])].tolist() == [0, 0]  # advanced indexing, as kernels do
    with pytest.raises(AttributeError):
        pool.req_to_token = torch.zeros((5, 32), dtype=torch.int32)


@pytest.mark.parametrize("page_size", [1, 4])
def test_table_follows_every_request_flow(page_size):
    pool, allocator, cache = build(num_tokens=128, page_size=page_size)
    a, b = Req("a", list(range(1, 11))), Req("b", list(range(1, 8)) + [40, 41])
    admit(pool, allocator, cache, a)
    a.output_ids.append(50)
    cache.cache_unfinished_req(a)  # rebinds a's row to the tree's slots
    rows_equal_state(pool)
    admit(pool, allocator, cache, b)  # prefix written from a match
    for token in (51, 52, 53):
        decode_one(pool, allocator, a, token)
    rows_equal_state(pool)
    cache.cache_finished_req(a)
    cache.checkpoint(b, up_to=9)
    rows_equal_state(pool)
    assert check(cache.state) == []


def test_planner_allocations_reach_the_table_at_the_row_end():
    """plan_extend / plan_decode emit Allocate items: positions come from the row length before them."""
    pool, allocator, cache = build(num_tokens=64, page_size=4)
    row = pool.alloc(1)[0]
    engine = cache.engine
    with engine.batch() as batch:
        extended = plan_extend(batch, [(row, 6)], at_head=True)
    with engine.batch() as batch:
        decoded = plan_decode(batch, [row], at_head=True)
        more = plan_decode(batch, [row], at_head=True)  # two items of one row in one batch
    assert pool.req_to_token[row, :8].tolist() == extended[0] + decoded + more
    rows_equal_state(pool)


def test_a_rolled_back_batch_writes_nothing():
    pool, allocator, cache = build(num_tokens=64, page_size=4)
    row = pool.alloc(1)[0]
    with unchanged(pool), pytest.raises(RuntimeError):
        with cache.engine.batch() as batch:
            plan_extend(batch, [(row, 6)], at_head=True)
            raise RuntimeError("the caller gives up after the planner emitted")
    rows_equal_state(pool)


def test_a_refused_event_writes_nothing():
    pool, allocator, _ = build(num_tokens=32)
    row = pool.alloc(1)[0]
    with unchanged(pool), pytest.raises(InvalidEvent):
        pool.write((row, slice(0, 2)), torch.tensor([5, 6]))  # slots nobody allocated
    with unchanged(pool), pytest.raises(InvalidEvent):
        pool.engine.apply(Allocate((1,), ((row, (1,)), (row + 1, (2,)))))  # row + 1 is not open


def test_a_write_that_bypasses_the_pool_is_reported():
    pool, allocator, cache = build(num_tokens=32)
    req = Req("a", [1, 2, 3, 4])
    admit(pool, allocator, cache, req)
    fingerprint = cache.state.fingerprint()
    pool.req_to_token[req.req_pool_idx, 2] = 17  # a kernel or a user writing behind our back
    problems = pool.verify()
    assert [p.check for p in problems] == ["req_to_token"]
    assert f"row {req.req_pool_idx} position 2" in problems[0].message and "17" in problems[0].message
    assert cache.state.fingerprint() == fingerprint  # the state is not "corrected" from the tensor
    assert check(cache.state) + problems == problems  # reported alongside kvstate.check's findings
    pool.write((req.req_pool_idx, 2), pool.state.slots_of(req.req_pool_idx)[2])  # repair through write
    assert pool.verify() == []


def test_stale_entries_past_a_row_end_are_left_alone_as_in_sglang():
    pool, allocator, cache = build(num_tokens=32)
    req = Req("a", [1, 2, 3])
    admit(pool, allocator, cache, req)
    row = req.req_pool_idx
    written = pool.req_to_token[row, :3].tolist()
    allocator.free(pool.req_to_token[row, :3].to(torch.int64))
    pool.free(row)
    assert pool.req_to_token[row, :3].tolist() == written and pool.verify() == []
