"""The decode step as one decision (``alloc_for_decode`` / ``kvstate.planner.swa_decode``).

``hybrid_scheduler.decode_step`` and ``mamba_scheduler.decode_step`` plan a
whole decode step (the out-of-window SWA frees, then each request's eviction
and slot) in one batch.  Here each differential op list is run twice on the
kvstate front end: once with that step, once with a reference step made of
the separate allocator calls the scheduler used to make (``maybe_evict_swa``,
then per request ``evict_to_free_tokens``, ``alloc`` / ``alloc_decode`` and
the row write).  After every op the states, the op results, the
``req_to_token`` rows and the mapping tensors must be equal; the batched
step must also commit fewer batches.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import kvstate.sglang.hybrid_scheduler as hybrid_scheduler
import kvstate.sglang.mamba_scheduler as mamba_scheduler
from kvstate.events import Allocate, SwaAlloc, SwaFree
from kvstate.sglang.hybrid_req import SWA
from tools.diff_sglang_hybrid import generate as generate_swa
from tools.diff_sglang_mamba import generate as generate_mamba
from tools.hybrid_ops import apply_op as apply_swa
from tools.hybrid_sides import Side as SwaSide
from tools.mamba_ops import apply_op as apply_mamba
from tools.mamba_sides import Side as MambaSide


def _slide(cache: Any, reqs: Any, interval: int) -> None:
    if cache.supports_swa():
        cache.maybe_evict_swa(list(reqs), eviction_interval=interval)


def _reference_step(cache: Any, reqs: Any, token: int, interval: int, *, mamba: bool) -> list[int]:
    """A decode step through the separate allocator calls (the pre-decision path)."""
    allocator, pool = cache.token_to_kv_pool_allocator, cache.req_to_token_pool
    _slide(cache, reqs, interval)
    size = allocator.page_size
    slots = []
    for req in reqs:
        row, length = req.kv.req_pool_idx, req.kv.kv_allocated_len
        mamba_scheduler.evict_to_free_tokens(cache, size)
        if size == 1:
            out = allocator.alloc(1)
        else:
            last = pool.req_to_token[row, length - 1].to(torch.int64).view(1)
            if mamba and not mamba_scheduler.pools_fit(allocator, int(length % size == 0)):
                raise MemoryError("decode out of memory")
            after = torch.tensor([length + 1])
            out = allocator.alloc_decode(after, after, last)
        if out is None:
            raise MemoryError("decode out of memory")
        pool.write((row, length), out.to(torch.int32)[:1])
        req.kv.kv_allocated_len += 1
        req.kv.kv_committed_len += 1
        req.output_ids.append(token)
        req.decode_batch_idx += 1
        if mamba:
            mamba_scheduler.track_decode(cache, req)
        slots.append(int(out[0]))
    return slots


def _snapshot(side: Any) -> list[Any]:
    cache = side.cache
    out = [cache.engine.state.fingerprint(), side.pool.req_to_token.tolist()]
    mapping = getattr(side.alloc, "full_to_swa_index_mapping", None)
    if mapping is not None:
        out.append(mapping.tolist())
    for name in ("req_index_to_mamba_index_mapping",
                 "req_index_to_mamba_ping_pong_track_buffer_mapping"):
        tensor = getattr(side.pool, name, None)
        if tensor is not None:
            out.append(tensor.tolist())
    out.append([(r.kv.kv_allocated_len, r.kv.get_evicted_seqlen(SWA)) for r in side.running])
    return out


def _both(monkeypatch: Any, module: Any, reference: Any, make: Any, ops: list[Any],
          apply: Any) -> int:
    """Run ``ops`` on two fresh sides, the second with ``reference`` as the decode step;
    compare after each op.  The number of decode ops that did a step."""
    ours, theirs = make(), make()
    decided = module.decode_step
    steps = 0
    for index, op in enumerate(ops):
        monkeypatch.setattr(module, "decode_step", decided)
        mine = apply(ours, op)
        monkeypatch.setattr(module, "decode_step", reference)
        other = apply(theirs, op)
        assert mine == other, (index, op)
        assert _snapshot(ours) == _snapshot(theirs), (index, op)
        steps += op[0] == "decode" and not isinstance(mine, str)
    if hasattr(ours.alloc, "verify"):
        assert ours.alloc.verify() == []
    return steps


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("seed", [-1, 0, 1, 2, 3])
def test_swa_decode_decision_matches_the_separate_calls(monkeypatch, seed, page_size):
    window, interval, ops = generate_swa(seed, 150, page_size)

    def reference(cache, reqs, token, *, interval=interval):
        return _reference_step(cache, reqs, token, interval, mamba=False)

    steps = _both(monkeypatch, hybrid_scheduler, reference,
                  lambda: SwaSide("kvstate", "-", page_size, window), ops,
                  lambda side, op: apply_swa(side, op, interval))
    assert steps > 0


@pytest.mark.parametrize(("config", "page_size"), [
    ("mamba-nobuf", 1), ("mamba-extra", 1), ("mamba-extra", 4),
    ("swa-mamba-nobuf", 1), ("swa-mamba-extra", 1), ("swa-mamba-extra", 4)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mamba_decode_decision_matches_the_separate_calls(monkeypatch, config, page_size, seed):
    setup, ops = generate_mamba(config, seed, 150, page_size)

    def reference(cache, reqs, token, *, interval=setup["interval"]):
        return _reference_step(cache, reqs, token, interval, mamba=True)

    steps = _both(monkeypatch, mamba_scheduler, reference, lambda: MambaSide("kvstate", "-", setup),
                  ops, apply_mamba)
    assert steps > 0


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_decode_step_is_one_batch(page_size):
    """Without eviction, a step commits one batch: the window frees, one ``Allocate``
    writing every request's slot into its row, one ``SwaAlloc`` for the fresh pages."""
    window, interval, ops = generate_swa(0, 400, page_size)
    side = SwaSide("kvstate", "-", page_size, window)
    engine = side.cache.engine
    seen = 0
    for op in ops:
        before = len(engine.events)
        result = apply_swa(side, op, interval)
        if op[0] != "decode" or isinstance(result, str):
            continue
        events = engine.events[before:]
        kinds = [type(event) for event in events]
        if any(kind not in (Allocate, SwaAlloc, SwaFree) for kind in kinds):
            continue  # the step evicted
        assert kinds.count(Allocate) == 1 and kinds.count(SwaAlloc) <= 1, kinds
        allocate = next(event for event in events if type(event) is Allocate)
        assert [slots[0] for _, slots in allocate.items] == result
        seen += 1
    assert seen >= 5
