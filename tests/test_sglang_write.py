"""``ReqToTokenPool.write``: the row forms, SGLang's batched form, and every malformed index."""

import numpy as np
import pytest
import torch

from kvstate import InvalidEvent, check
from kvstate.events import Assign, Scatter
from kvstate.sglang import Req
from tests.sglang_helpers import admit, build, unchanged


def running(page_size=1, count=3, prompt=5):
    pool, allocator, cache = build(num_tokens=128, page_size=page_size, rows=4, width=32)
    reqs = [Req(i, [10 * i + t for t in range(1, prompt + 1)]) for i in range(count)]
    for req in reqs:
        admit(pool, allocator, cache, req)
    return pool, allocator, cache, reqs


@pytest.mark.parametrize("page_size", [1, 4])
def test_batched_decode_write_is_one_scatter(page_size):
    pool, allocator, cache, reqs = running(page_size)
    rows = torch.tensor([r.req_pool_idx for r in reqs])
    seq_lens = torch.tensor([5, 5, 5])
    if page_size == 1:
        out = allocator.alloc(3)
    else:
        last = pool.req_to_token[rows, seq_lens - 1]
        out = allocator.alloc_decode(seq_lens + 1, seq_lens + 1, last)
    before = len(cache.events)
    pool.write((rows, seq_lens), out.to(torch.int32))
    assert [type(e) for e in cache.events[before:]] == [Scatter]
    assert cache.events[-1].items == tuple(zip(rows.tolist(), [5, 5, 5], out.tolist(), strict=True))
    assert pool.req_to_token[rows, seq_lens].tolist() == out.tolist()
    assert [cache.state.requests[r].allocated for r in rows.tolist()] == [6, 6, 6]
    assert check(cache.state) == [] and pool.verify() == []


def test_batched_form_takes_lists_and_numpy():
    pool, allocator, cache, reqs = running(count=2)
    rows = [r.req_pool_idx for r in reqs]
    pool.write((rows, [5, 5]), allocator.alloc(2).tolist())
    pool.write((np.array(rows), np.array([6, 6])), allocator.alloc(2).numpy())
    assert [cache.state.requests[r].allocated for r in rows] == [7, 7] and pool.verify() == []


def test_row_forms_are_one_assign_each():
    pool, allocator, cache = build(num_tokens=32)
    row = pool.alloc(1)[0]
    slots = allocator.alloc(4)
    pool.write((row, slice(0, 3)), slots[:3])
    pool.write((torch.tensor(row), 3), slots[3])  # a 0-d tensor row, one int position
    pool.write((row, slice(4, 4)), torch.empty((0,), dtype=torch.int64))  # empty: no event
    assert [type(e) for e in cache.events[-2:]] == [Assign, Assign]
    assert pool.req_to_token[row, :4].tolist() == slots.tolist() and pool.verify() == []


MALFORMED = {
    "a slice with a step": lambda row, s: ((row, slice(0, 4, 2)), s[:4]),
    "a reversed slice": lambda row, s: ((row, slice(3, 1)), s[:0]),
    "a slice longer than the values": lambda row, s: ((row, slice(0, 4)), s[:3]),
    "a negative start": lambda row, s: ((row, slice(-2, None)), s[:2]),
    "past max_context_len": lambda row, s: ((row, slice(30, 34)), s[:4]),
    "a float position": lambda row, s: ((row, 1.0), s[:1]),
    "two values at one position": lambda row, s: ((row, 0), s[:2]),
    "row 0 (padding)": lambda row, s: ((0, slice(0, 1)), s[:1]),
    "a row past size": lambda row, s: ((5, slice(0, 1)), s[:1]),
    "a bool row": lambda row, s: ((True, slice(0, 1)), s[:1]),
    "float values": lambda row, s: ((row, slice(0, 2)), torch.tensor([1.0, 2.0])),
    "negative values": lambda row, s: ((row, slice(0, 2)), [-1, 2]),
    "None values": lambda row, s: ((row, slice(0, 1)), None),
    "a bare row": lambda row, s: (row, s[:1]),
    "three indices": lambda row, s: ((row, 0, 1), s[:1]),
    "batched: lengths differ": lambda row, s: (([row, row - 1], [0]), s[:2]),
    "batched: a row twice": lambda row, s: (([row, row], [0, 1]), s[:2]),
    "batched: a slice of positions": lambda row, s: (([row], slice(0, 1)), s[:1]),
    "batched: negative position": lambda row, s: (([row], [-1]), s[:1]),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_writes_are_refused_and_change_nothing(case):
    pool, allocator, _ = build(num_tokens=32, rows=4, width=32)
    row = pool.alloc(1)[0]
    slots = allocator.alloc(6)
    pool.write((row, slice(0, 1)), slots[:1])
    indices, values = MALFORMED[case](row, slots)
    with unchanged(pool), pytest.raises((TypeError, ValueError)) as raised:
        pool.write(indices, values)
    assert not isinstance(raised.value, InvalidEvent), "refused before any event was built"


def test_writes_the_state_refuses_change_nothing():
    pool, allocator, _, reqs = running(count=2)
    rows = [r.req_pool_idx for r in reqs]
    fresh = allocator.alloc(1)
    with unchanged(pool), pytest.raises(InvalidEvent):
        pool.write((rows, [5, 7]), [int(fresh[0]), int(fresh[0]) + 1])  # a gap in row 2
    with unchanged(pool), pytest.raises(InvalidEvent):
        pool.write((1, slice(0, 1)), fresh)  # row 1 is not allocated


@pytest.mark.parametrize("dtype", [torch.int16, torch.int64])
def test_write_with_index_tensors_numpy_cannot_view(dtype):
    # A lazily negated tensor has no numpy view: the table is written from the checked ints.
    pool, allocator, _ = build(num_tokens=16, rows=4, width=8)
    rows = pool.alloc(2)
    slots = allocator.alloc(2)
    negated = torch._neg_view(torch.tensor([-rows[0], -rows[1]], dtype=dtype))
    pool.write((negated, torch.tensor([0, 0])), slots)
    assert pool.verify() == []
    assert [int(pool.req_to_token[row, 0]) for row in rows] == slots.tolist()
