"""A prefill chunk as one decision (``alloc_for_extend`` / ``plan_extend_step``).

``hybrid_scheduler.admit`` and ``mamba_scheduler``'s admission and
``extend_chunk`` evict, allocate and write each prefill chunk in one batch.
Here each differential op list is run twice on the kvstate front end: once
with that decision, once with a reference made of the separate calls the
schedulers used to make (``evict_to_free_tokens``, ``alloc`` /
``alloc_extend``, then the row writes of the hit and of the chunk).  After
every op the states, the op results, the ``req_to_token`` rows and the
mapping tensors must be equal.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import kvstate.sglang.hybrid_scheduler as hybrid_scheduler
import kvstate.sglang.mamba_scheduler as mamba_scheduler
from kvstate.events import Allocate
from kvstate.sglang.params import MatchPrefixParams, RadixKey
from tests.test_swa_decode import _snapshot
from tools.diff_sglang_hybrid import generate as generate_swa
from tools.diff_sglang_mamba import generate as generate_mamba
from tools.hybrid_ops import apply_op as apply_swa
from tools.hybrid_sides import Side as SwaSide
from tools.mamba_ops import apply_op as apply_mamba
from tools.mamba_sides import Side as MambaSide


def _separate_calls(cache: Any, req: Any, end: int, prefix_len: int | None) -> torch.Tensor:
    """Evict, allocate, write the hit (``prefix_len`` given) and the chunk, as separate
    calls; the new slots (``MemoryError`` when short)."""
    allocator, pool = cache.token_to_kv_pool_allocator, cache.req_to_token_pool
    row = req.kv.req_pool_idx
    start = req.kv.kv_allocated_len if prefix_len is None else prefix_len
    prefix = cache.prefix_device_indices(req) if prefix_len else None
    extend, size = end - start, allocator.page_size
    if size == 1:
        mamba_scheduler.evict_to_free_tokens(cache, extend)
        out = allocator.alloc(extend)
    else:
        if prefix is not None:
            last = prefix[-1:]
        elif start:
            last = pool.req_to_token[row, start - 1:start].to(torch.int64)
        else:
            last = torch.full((1,), -1, dtype=torch.int64)
        mamba_scheduler.evict_to_free_tokens(cache, extend + size)
        if not mamba_scheduler.pools_fit(allocator, -(-end // size) - -(-start // size)):
            raise MemoryError("prefill out of memory")
        lens = torch.tensor([start]), torch.tensor([end])
        out = allocator.alloc_extend(lens[0], lens[0], lens[1], lens[1], last, extend)
    if out is None:
        raise MemoryError("prefill out of memory")
    if prefix is not None:
        pool.write((row, slice(0, start)), prefix)
    pool.write((row, slice(start, end)), out)
    return out


def _mamba_reference(cache: Any, req: Any, end: int, prefix_len: int | None = None) -> Any:
    out = _separate_calls(cache, req, end, prefix_len)
    req.kv.kv_allocated_len = req.kv.kv_committed_len = end
    req.extend_end = end
    mamba_scheduler.track_extend(cache, req)
    return out


def _hybrid_reference(cache: Any, req: Any) -> Any:
    fill = req.full_untruncated_fill_ids
    found = cache.match_prefix(MatchPrefixParams(key=RadixKey(fill, limit=len(fill) - 1)))
    req.prefix_len = found.device_prefix_len
    req.last_node = found.last_device_node
    req.swa_branching_seqlen = found.swa_branching_seqlen
    req.kv.cache_protected_len = req.prefix_len
    req.lock = cache.lock(req.last_node)
    req.kv.req_pool_idx = cache.req_to_token_pool.alloc(1)[0]
    out = _separate_calls(cache, req, len(fill), req.prefix_len)
    req.kv.kv_allocated_len = req.kv.kv_committed_len = req.extend_end = len(fill)
    return out


def _both(monkeypatch: Any, module: Any, name: str, reference: Any, make: Any,
          ops: list[Any], apply: Any) -> int:
    """Run ``ops`` on two fresh sides, the second with ``reference`` in place of
    ``module.name``; compare after each op.  The number of admissions that did one."""
    ours, theirs = make(), make()
    decided = getattr(module, name)
    admitted = 0
    for index, op in enumerate(ops):
        monkeypatch.setattr(module, name, decided)
        mine = apply(ours, op)
        monkeypatch.setattr(module, name, reference)
        other = apply(theirs, op)
        assert mine == other, (index, op)
        assert _snapshot(ours) == _snapshot(theirs), (index, op)
        admitted += op[0].startswith("admit") and not isinstance(mine, str)
    if hasattr(ours.alloc, "verify"):
        assert ours.alloc.verify() == []
    assert ours.pool.verify() == []
    return admitted


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_swa_admission_decision_matches_the_separate_calls(monkeypatch, seed, page_size):
    window, interval, ops = generate_swa(seed, 150, page_size)
    admitted = _both(monkeypatch, hybrid_scheduler, "admit", _hybrid_reference,
                     lambda: SwaSide("kvstate", "-", page_size, window), ops,
                     lambda side, op: apply_swa(side, op, interval))
    assert admitted > 0


@pytest.mark.parametrize(("config", "page_size"), [
    ("mamba-nobuf", 1), ("mamba-extra", 1), ("mamba-extra", 4),
    ("swa-mamba-nobuf", 1), ("swa-mamba-extra", 1), ("swa-mamba-extra", 4)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mamba_chunk_decision_matches_the_separate_calls(monkeypatch, config, page_size, seed):
    setup, ops = generate_mamba(config, seed, 150, page_size)
    admitted = _both(monkeypatch, mamba_scheduler, "_extend", _mamba_reference,
                     lambda: MambaSide("kvstate", "-", setup), ops, apply_mamba)
    assert admitted > 0


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_prefill_chunk_is_one_allocate(page_size):
    """Each chunk of a chunked admission is appended to the row by one ``Allocate`` of its
    own (the row write folded into it): as many as there are chunks, covering the extend."""
    setup, ops = generate_mamba("mamba-extra", 0, 400, page_size)
    side = MambaSide("kvstate", "-", setup)
    engine = side.cache.engine
    seen = 0
    for op in ops:
        before = len(engine.events)
        result = apply_mamba(side, op)
        if op[0] != "admit_chunked" or isinstance(result, str) or result[0] == "oom":
            continue
        tokens, _, chunk = op[1]
        row, hit = side.running[-1].kv.req_pool_idx, result[0]
        appended = [slots for event in engine.events[before:] if type(event) is Allocate
                    for request, slots in event.items if request == row]
        assert len(appended) == -(-(len(tokens) - hit) // chunk)
        assert sum(map(len, appended)) == len(tokens) - hit
        seen += 1
    assert seen >= 3


def _chunked_by_hand(side: Any, tokens: list[int], ends: list[int], decided: bool) -> Any:
    """Admit ``tokens`` with no hit and prefill them in chunks ending at ``ends``, through
    ``alloc_for_extend`` (``decided``) or the separate calls; the request."""
    from kvstate.sglang.hybrid_req import HybridReq

    cache = side.cache
    req = HybridReq(0, tokens)
    req.prefix_len, req.last_node = 0, cache.root_node
    req.kv.req_pool_idx = side.pool.alloc(1)[0]
    start: int | None = 0
    for end in ends:
        if decided:
            step = cache.alloc_for_extend(req, end, prefix_len=start)
            assert step.stopped is None
        else:
            _separate_calls(cache, req, end, start)
        req.kv.kv_allocated_len = req.kv.kv_committed_len = end
        start = None
    return req


@pytest.mark.parametrize("ends", [[6, 11], [3, 4, 9, 10]])
def test_a_chunk_that_starts_inside_a_page(ends):
    """A chunk that continues the row's own partial page (a chunk size that is not a multiple
    of the page): the same state as the separate calls, and still one ``Allocate`` appending
    every new slot of the chunk to the row (the partial page's slots first)."""
    ours, theirs = SwaSide("kvstate", "-", 4, 5), SwaSide("kvstate", "-", 4, 5)
    tokens = list(range(1, ends[-1] + 1))
    engine = ours.cache.engine
    before = len(engine.events)
    req = _chunked_by_hand(ours, tokens, ends, decided=True)
    _chunked_by_hand(theirs, tokens, ends, decided=False)
    assert _snapshot(ours) == _snapshot(theirs)
    row = req.kv.req_pool_idx
    appended = [slots for event in engine.events[before:] if type(event) is Allocate
                for request, slots in event.items if request == row]
    assert [len(slots) for slots in appended] == [b - a for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    assert [slot for slots in appended for slot in slots] == \
        ours.pool.req_to_token[row, :ends[-1]].tolist()
