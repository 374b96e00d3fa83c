"""One op of ``tools/diff_sglang_mamba.py`` on either side (``mamba_sides.Side``).

Bare tree calls: ``insert`` (fresh FULL slots and a fresh Mamba slot; the
tree frees the duplicate FULL part, the caller frees its slot when the node
had a state), ``match``, ``lock`` (match, then lock the hit), ``unlock``
(optionally ``release_swa`` first), ``release_swa``, ``evict`` /
``evict_swa`` / ``evict_mamba`` / ``evict_alloc``.  Request flows in
0.5.23's scheduler order: ``admit`` (match with copy-on-match, lock, Mamba
capacity, row and slots, KV shortfall and allocation, row writes, the
extend's tracked checkpoint, first token, checkpoint), ``admit_done`` (the
same, finishing at its first token), ``decode`` (the SWA window slide, one
token per running request, the decode's tracked checkpoints), ``finish``
and ``abort`` (``release_kv_cache`` with and without the checkpoint).
kvstate runs ``kvstate.sglang.mamba_scheduler``; SGLang runs its own
functions, with the scheduler's Mamba tracking written out here as 0.5.23's
batch code does it.  An admission or a decode that does not fit is undone
the same way on both sides.
"""

from __future__ import annotations

from array import array
from typing import Any


def apply_op(side: Any, op: list[Any]) -> Any:
    kind, arg = op
    if kind == "insert":
        n = len(arg)
        short = side.has_swa and side.alloc.swa_available_size() < n
        if side.full_free() < n or short or side.pool.mamba_allocator.available_size() < 1:
            return "skip"
        value = side.bare_alloc(n)
        state = side.pool.mamba_allocator.alloc(1)
        result = side.insert(arg, value, state)
        if result.mamba_exist:
            side.pool.mamba_allocator.free(state)
        return [int(result.prefix_len), bool(result.mamba_exist)]
    if kind == "match":
        return side.hit(side.match(arg))
    if kind == "lock":
        if len(side.locks) >= 2:  # bounded, so the Mamba pool never runs dry mid-checkpoint
            return "full"
        result = side.match(arg)
        side.locks.append(side.cache.lock(result.last_device_node))
        return [side.hit(result), side.receipt(side.locks[-1])]
    if kind in ("unlock", "release_swa"):
        if not side.locks:
            return "none"
        index = int(arg[0] * len(side.locks))
        if kind == "release_swa" or arg[1] < 0.5:
            side.cache.release_swa(side.locks[index])
        if kind == "unlock":
            side.cache.unlock(side.locks.pop(index))
        return index
    if kind in ("evict", "evict_swa", "evict_mamba"):
        counts = {"evict": [arg, 0, 0], "evict_swa": [0, arg, 0], "evict_mamba": [0, 0, arg]}
        return side.evict(*counts[kind], False)
    if kind == "evict_alloc":
        return side.evict(*arg, True)
    if kind in ("admit", "admit_done", "admit_chunked"):
        if len(side.running) >= 3:
            return "full"
        admit = _kvstate_admit if side.kind == "kvstate" else _sglang_admit
        tokens, first, chunk = (*arg, None) if len(arg) == 2 else arg
        return admit(side, tokens, first, done=kind == "admit_done", chunk=chunk)
    if kind == "decode":
        live = [req for req in side.running if not req.finished()]
        if not live:
            return "none"
        return (_kvstate_decode if side.kind == "kvstate" else _sglang_decode)(side, live, arg)
    if kind in ("finish", "abort"):
        if not side.running:
            return "none"
        req = side.running.pop(int(arg * len(side.running)))
        (_kvstate_release if side.kind == "kvstate" else _sglang_release)(side, req, kind)
        return len(side.running)
    raise ValueError(f"unknown op {kind}")


def _found(req: Any) -> list[Any]:
    slot = req.kv.mamba_pool_idx
    source = req.kv.mamba_cow_src_index
    return [req.prefix_len, req.swa_branching_seqlen, req.mamba_branching_seqlen,
            None if slot is None else int(slot), None if source is None else int(source)]


# -- kvstate ----------------------------------------------------------------------------
def _kvstate_admit(side: Any, tokens: list[int], first: int, *, done: bool,
                   chunk: int | None) -> Any:
    from kvstate.sglang.mamba_req import MambaReq
    from kvstate.sglang.mamba_scheduler import abort, admit, extend_chunk, prefill_done, undo_admit
    from kvstate.sglang.unified_flows import checkpoint_kv_cache

    req = MambaReq(str(len(side.running)), tokens)
    try:
        admit(side.cache, req, chunk=chunk)
    except MemoryError:
        undo_admit(side.cache, req)
        return "oom"
    found = _found(req)
    while chunk is not None and req.extend_end < len(tokens):
        checkpoint_kv_cache(req, side.cache)
        try:
            extend_chunk(side.cache, req, chunk)
        except MemoryError:
            abort(side.cache, req)
            return ["oom", found]
    prefill_done(side.cache, req, first, finished=done)
    side.running.append(req)
    return found


def _kvstate_decode(side: Any, live: list[Any], token: int) -> Any:
    from kvstate.sglang.mamba_scheduler import decode_step

    try:
        return decode_step(side.cache, live, token, interval=side.setup["interval"])
    except MemoryError:
        return "oom"


def _kvstate_release(side: Any, req: Any, kind: str) -> None:
    from kvstate.sglang.mamba_scheduler import abort, finish

    (finish if kind == "finish" else abort)(side.cache, req)


# -- SGLang ---------------------------------------------------------------------------------
def _sglang_admit(side: Any, tokens: list[int], first: int, *, done: bool,
                  chunk: int | None) -> Any:
    import torch
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req
    from sglang.srt.mem_cache.allocation import ensure_mamba_capacity
    from sglang.srt.mem_cache.common import checkpoint_kv_cache
    from sglang.srt.sampling.sampling_params import SamplingParams

    cache, pool = side.cache, side.pool
    req = Req(rid=str(len(side.running)), origin_input_text="",
              origin_input_ids=array("q", tokens),
              sampling_params=SamplingParams(temperature=0, max_new_tokens=64))
    try:
        req.init_next_round_input(cache)
    except AssertionError:  # no slot for the copy-on-match, even after eviction
        return "oom"
    req.lock = cache.lock(req.last_node)
    if not ensure_mamba_capacity(pool, [req], cache):
        return _sglang_undo(side, req)
    pool.alloc([req])
    prefix_len = req.prefix_len
    prefix = (cache.prefix_device_indices(req) if prefix_len
              else torch.empty(0, dtype=torch.int64))
    end = len(tokens) if chunk is None else min(len(tokens), prefix_len + chunk)
    last = prefix[-1:] if prefix_len else torch.full((1,), -1, dtype=torch.int64)
    if not _sglang_extend(side, req, prefix_len, end, last, prefix):
        return _sglang_undo(side, req)
    found = _found(req)
    while chunk is not None and req.extend_end < len(tokens):
        checkpoint_kv_cache(req, cache)
        start = req.kv.kv_allocated_len
        last = pool.req_to_token[req.kv.req_pool_idx, start - 1:start].to(torch.int64)
        if not _sglang_extend(side, req, start, min(len(tokens), start + chunk), last, None):
            _sglang_release(side, req, "abort")
            return ["oom", found]
    req.output_ids.append(first)
    if done:
        req.finished_reason = FINISH_LENGTH(length=0)
    else:
        checkpoint_kv_cache(req, cache)
        req.decode_batch_idx = 0
    side.running.append(req)
    return found


def _sglang_extend(side: Any, req: Any, start: int, end: int, last: Any, prefix: Any) -> bool:
    """``alloc_for_extend`` after the row: evict, allocate ``[start, end)``, write the hit's
    prefix (at admission) and the new slots, track the extend; False when out of memory."""
    import torch
    from sglang.srt.mem_cache.common import evict_from_tree_cache

    cache, pool, alloc = side.cache, side.pool, side.alloc
    extend = end - start
    if side.ps == 1:
        evict_from_tree_cache(cache, extend)
        out = alloc.alloc(extend)
    else:
        evict_from_tree_cache(cache, extend + side.ps)
        if not _fits(side, -(-end // side.ps) - -(-start // side.ps)):
            return False
        lens = torch.tensor([start]), torch.tensor([end])
        out = alloc.alloc_extend(lens[0], lens[0], lens[1], lens[1], last, extend)
    if out is None:
        return False
    row = req.kv.req_pool_idx
    if prefix is not None:
        pool.write((row, slice(0, start)), prefix.to(torch.int32))
    pool.write((row, slice(start, end)), out.to(torch.int32))
    req.kv.kv_allocated_len = req.kv.kv_committed_len = end
    req.extend_end = end
    _sglang_track_extend(side, req)
    return True


def _fits(side: Any, pages: int) -> bool:
    """The scheduler's capacity check before a paged allocation (0.5.23's SWA allocator
    keeps one pool's pages when the other is short)."""
    tokens = pages * side.ps
    if side.has_swa:
        return bool(side.alloc.full_available_size() >= tokens
                    and side.alloc.swa_available_size() >= tokens)
    return bool(side.alloc.available_size() >= tokens)


def _sglang_undo(side: Any, req: Any) -> str:
    pool = side.pool
    if req.kv.holds_mamba:
        if req.kv.holds_kv:
            pool.free_mamba_cache(req)
        else:
            pool.mamba_allocator.free(req.kv.mamba_pool_idx.unsqueeze(0))
            req.kv.mamba_pool_idx = None
    if req.kv.holds_kv:
        pool.free(req)
    side.cache.unlock(req.lock)
    req.lock = None
    return "oom"


def _sglang_track_extend(side: Any, req: Any) -> None:
    """ScheduleBatch's extend tracking (non-DCP, no lazy buffer), on a bare request."""
    if not side.extra:
        return
    from sglang.srt.runtime_context import mamba_cache_chunk_size, mamba_checkpoint_grid

    grid, chunk = mamba_checkpoint_grid(side.ps), mamba_cache_chunk_size()
    prefix, end = req.prefix_len, req.extend_end
    extend = end - prefix
    if extend < grid:
        return
    aligned = prefix + extend // grid * grid
    state_chunk = side.setup["chunk"]
    track_at = end if prefix + extend // state_chunk * state_chunk == aligned else aligned + 1
    kv = req.kv
    kv.mamba_last_track_idx = kv.mamba_next_track_idx
    kv.mamba_next_track_idx = side.pool.get_mamba_ping_pong_other_idx(kv.mamba_next_track_idx)
    branch = req.mamba_branching_seqlen
    if branch is not None and prefix < branch < track_at and (branch - prefix) % chunk == 0:
        aligned = branch
    kv.mamba_last_track_seqlen = aligned


def _sglang_decode(side: Any, live: list[Any], token: int) -> Any:
    import torch
    from sglang.srt.mem_cache.common import evict_from_tree_cache
    from sglang.srt.runtime_context import mamba_track_grid

    cache, alloc, pool = side.cache, side.alloc, side.pool
    if side.has_swa:
        window, interval = cache.swa_retain_window, side.setup["interval"]
        alloc.free_group_begin()
        for req in live:
            due = req.seqlen - 1 - window >= req.kv.get_evicted_seqlen(side.SWA) + interval
            if req.decode_batch_idx >= 1 and req.kv.holds_kv and due:
                cache.evict_sliding_windows(req, req.seqlen - 1, eviction_interval=1)
        alloc.free_group_end()
    slots = []
    for req in live:
        row, length = req.kv.req_pool_idx, req.kv.kv_allocated_len
        if side.ps == 1:
            evict_from_tree_cache(cache, 1)
            out = alloc.alloc(1)
        else:
            last = pool.req_to_token[row, length - 1].to(torch.int64).view(1)
            evict_from_tree_cache(cache, side.ps)
            if not _fits(side, int(length % side.ps == 0)):
                return "oom"
            after = torch.tensor([length + 1])
            out = alloc.alloc_decode(after, after, last)
        if out is None:
            return "oom"
        pool.write((row, length), out.to(torch.int32)[0])
        req.kv.kv_allocated_len += 1
        req.kv.kv_committed_len += 1
        req.output_ids.append(token)
        req.decode_batch_idx += 1
        kv = req.kv
        if side.extra and kv.kv_committed_len % mamba_track_grid(side.ps) == 0:
            index = kv.mamba_next_track_idx
            kv.mamba_prev_track_seqlen = kv.mamba_last_track_seqlen
            kv.mamba_last_track_seqlen = kv.kv_committed_len
            kv.mamba_last_track_idx = index
            kv.mamba_next_track_idx = pool.get_mamba_ping_pong_other_idx(index)
        slots.append(int(out[0]))
    return slots


def _sglang_release(side: Any, req: Any, kind: str) -> None:
    from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH
    from sglang.srt.mem_cache.common import release_kv_cache

    if kind == "abort":
        req.finished_reason = FINISH_ABORT()
        release_kv_cache(req, side.cache, checkpoint=False)
        return
    if not req.finished():
        req.finished_reason = FINISH_LENGTH(length=0)
    release_kv_cache(req, side.cache, checkpoint=True)
