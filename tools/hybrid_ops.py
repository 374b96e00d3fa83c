"""One op of ``tools/diff_sglang_hybrid.py`` on either side (``hybrid_sides.Side``).

Bare tree calls: ``insert`` (fresh paired slots, the duplicate part freed
by the tree), ``match``, ``lock`` (match, then lock the hit), ``unlock``
(optionally ``release_swa`` first), ``release_swa``, ``evict`` /
``evict_swa`` / ``evict_alloc``.  Request flows in 0.5.23's scheduler order:
``admit`` (match up to ``len - 1``, lock, row, evict each pool's shortfall,
``alloc`` / ``alloc_extend``, row writes, first token, checkpoint), ``decode``
(``maybe_evict_swa`` with the seed's interval, then one token per running
request) and ``finish`` (``release_kv_cache``).  SGLang runs its own
scheduler functions; kvstate runs ``kvstate.sglang.hybrid_scheduler``.  An
admission or decode that does not fit is undone the same way on both sides.
"""

from __future__ import annotations

from array import array
from typing import Any


def apply_op(side: Any, op: list[Any], interval: int) -> Any:
    kind, arg = op
    if kind == "insert":
        tokens = arg
        n = len(tokens)
        if side.alloc.full_available_size() < n or side.alloc.swa_available_size() < n:
            return "skip"
        result = side.insert(tokens, side.bare_alloc(n))
        return [int(result.prefix_len), bool(result.swa_branch_inserted)]
    if kind == "match":
        return side.hit(side.match(arg))
    if kind == "lock":
        result = side.match(arg)
        side.locks.append(side.cache.lock(result.last_device_node))
        return [side.hit(result), side.receipt(side.locks[-1])]
    if kind in ("unlock", "release_swa"):
        if not side.locks:
            return "none"
        index = int(arg[0] * len(side.locks))
        lock = side.locks[index]
        if kind == "release_swa" or arg[1] < 0.5:
            side.cache.release_swa(lock)
        if kind == "unlock":
            side.cache.unlock(side.locks.pop(index))
        return index
    if kind == "evict":
        return side.evict(arg, 0, False)
    if kind == "evict_swa":
        return side.evict(0, arg, False)
    if kind == "evict_alloc":
        return side.evict(arg[0], arg[1], True)
    if kind == "admit":
        return _admit(side, *arg)
    if kind == "decode":
        return _decode(side, arg, interval)
    if kind == "finish":
        if not side.running:
            return "none"
        req = side.running.pop(int(arg * len(side.running)))
        _finish(side, req)
        return len(side.running)
    raise ValueError(f"unknown op {kind}")


def _admit(side: Any, tokens: list[int], first: int) -> Any:
    if len(side.running) >= 3:
        return "full"
    if side.kind == "sglang":
        return _sglang_admit(side, tokens, first)
    from kvstate.sglang.hybrid_req import HybridReq
    from kvstate.sglang.hybrid_scheduler import admit, prefill_done

    req = HybridReq(len(side.running), tokens)
    try:
        admit(side.cache, req)
    except MemoryError:
        return _undo(side, req)
    found = [req.prefix_len, req.swa_branching_seqlen]
    prefill_done(side.cache, req, first)
    side.running.append(req)
    return found


def _sglang_admit(side: Any, tokens: list[int], first: int) -> Any:
    import torch
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.allocation import alloc_req_slots
    from sglang.srt.mem_cache.common import checkpoint_kv_cache, evict_from_tree_cache
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req(rid=str(len(side.running)), origin_input_text="",
              origin_input_ids=array("q", tokens),
              sampling_params=SamplingParams(temperature=0, max_new_tokens=64))
    req.init_next_round_input(side.cache)
    req.lock = side.cache.lock(req.last_node)
    alloc_req_slots(side.pool, [req], side.cache)
    row, length, prefix_len = req.kv.req_pool_idx, len(tokens), req.prefix_len
    prefix = (side.cache.prefix_device_indices(req) if prefix_len
              else torch.empty(0, dtype=torch.int64))
    extend = length - prefix_len
    if side.ps == 1:
        evict_from_tree_cache(side.cache, extend)
        out = side.alloc.alloc(extend)
    else:
        last = prefix[-1:] if prefix_len else torch.full((1,), -1, dtype=torch.int64)
        evict_from_tree_cache(side.cache, extend + side.ps)
        lens = torch.tensor([prefix_len]), torch.tensor([length])
        out = side.alloc.alloc_extend(lens[0], lens[0], lens[1], lens[1], last, extend)
    if out is None:
        return _undo(side, req)
    side.pool.write((row, slice(0, prefix_len)), prefix.to(torch.int32))
    side.pool.write((row, slice(prefix_len, length)), out.to(torch.int32))
    req.kv.kv_allocated_len = req.kv.kv_committed_len = length
    req.extend_end = length
    found = [prefix_len, req.swa_branching_seqlen]
    req.output_ids.append(first)
    checkpoint_kv_cache(req, side.cache)
    req.decode_batch_idx = 0
    side.running.append(req)
    return found


def _undo(side: Any, req: Any) -> str:
    """An admission that did not fit: give the row back and drop the lock."""
    if side.kind == "sglang":
        side.pool.free(req)
        side.cache.unlock(req.lock)
    else:
        from kvstate.sglang.hybrid_scheduler import undo_admit

        undo_admit(side.cache, req)
    return "oom"


def _decode(side: Any, token: int, interval: int) -> Any:
    if not side.running:
        return "none"
    if side.kind == "kvstate":
        from kvstate.sglang.hybrid_scheduler import decode_step

        try:
            return decode_step(side.cache, side.running, token, interval=interval)
        except MemoryError:
            return "oom"
    import torch
    from sglang.srt.mem_cache.common import evict_from_tree_cache

    alloc, pool, window = side.alloc, side.pool, side.cache.swa_retain_window
    alloc.free_group_begin()
    for req in side.running:
        due = req.seqlen - 1 - window >= req.kv.get_evicted_seqlen(side.SWA) + interval
        if req.decode_batch_idx >= 1 and req.kv.holds_kv and due:
            side.cache.evict_sliding_windows(req, req.seqlen - 1, eviction_interval=1)
    alloc.free_group_end()
    slots = []
    for req in side.running:
        row, length = req.kv.req_pool_idx, req.kv.kv_allocated_len
        if side.ps == 1:
            evict_from_tree_cache(side.cache, 1)
            out = alloc.alloc(1)
        else:
            last = pool.req_to_token[row, length - 1].to(torch.int64).view(1)
            evict_from_tree_cache(side.cache, side.ps)
            after = torch.tensor([length + 1])
            out = alloc.alloc_decode(after, after, last)
        if out is None:
            return "oom"
        pool.write((row, length), out.to(torch.int32)[0])
        req.kv.kv_allocated_len += 1
        req.kv.kv_committed_len += 1
        req.output_ids.append(token)
        req.decode_batch_idx += 1
        slots.append(int(out[0]))
    return slots


def _finish(side: Any, req: Any) -> None:
    if side.kind == "kvstate":
        from kvstate.sglang.hybrid_scheduler import finish

        finish(side.cache, req)
        return
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH
    from sglang.srt.mem_cache.common import release_kv_cache

    req.finished_reason = FINISH_LENGTH(length=0)
    release_kv_cache(req, side.cache, checkpoint=True)
