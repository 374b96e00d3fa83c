"""The scheduler steps SGLang 0.5.23 runs around a Mamba ``UnifiedRadixCache``.

Owned by the caller, like SGLang's scheduler: these functions only call the
kvstate front end (``HybridReqToTokenPool``, the token allocator,
``UnifiedRadixCache``) in 0.5.23's order, and keep the request's Mamba
tracking fields as 0.5.23's batch code does, so a run is comparable call
for call with SGLang's (``tools/diff_sglang_mamba.py``):

* ``admit``: match the fill ids up to ``input_len - 1`` with copy-on-match,
  lock the hit, make room for the request's Mamba slots
  (``ensure_mamba_capacity``) and take them with its row
  (``HybridReqToTokenPool.alloc``), then as one decision
  (``alloc_for_extend``) evict the KV shortfall, allocate the extend and
  write it into the row after the hit's slots, and (extra buffer) track the
  extend's last grid boundary, or the branch point when it falls inside the
  extend on the chunk grid;
* ``extend_chunk``: the next chunk of a chunked prefill (after the previous
  chunk's checkpoint, ``checkpoint_kv_cache``), allocated into the row in
  one decision, tracked;
* ``prefill_done``: the first output token, then the unfinished checkpoint;
* ``decode_step``: the out-of-window SWA frees (with an SWA pool), one token
  per request, and (extra buffer) a tracked checkpoint each time the length
  reaches the track grid (``lcm(grid, mamba_track_interval)``);
* ``finish`` / ``abort``: ``release_kv_cache`` with / without the finishing
  checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvstate.planner.swa_decode import NO_SWA_PAGE
from kvstate.sglang.inputs import int64_tensor
from kvstate.sglang.mamba_req import MambaReq
from kvstate.sglang.params import EvictParams, MatchPrefixParams, RadixKey
from kvstate.sglang.unified_flows import SWA_EVICTION_INTERVAL, checkpoint_kv_cache


def evict_to_free_tokens(cache: Any, num_tokens: int) -> None:
    """The allocator's ``evict_to_free_tokens``: each pool's shortfall, for allocation."""
    allocator = cache.token_to_kv_pool_allocator
    if hasattr(allocator, "evict_to_free_tokens"):  # the SWA allocator asks per pool
        allocator.evict_to_free_tokens(cache, num_tokens)
        return
    shortfall = num_tokens - allocator.available_size()
    if shortfall > 0:
        cache.evict_for_alloc(EvictParams(num_tokens=shortfall))


def pools_fit(allocator: Any, pages: int) -> bool:
    """Whether every KV pool has ``pages`` free pages: the scheduler checks before it
    allocates (0.5.23's paged SWA allocator takes one pool's pages before it finds the other
    short, and does not give them back)."""
    tokens = pages * allocator.page_size
    if hasattr(allocator, "swa_available_size"):
        return bool(allocator.full_available_size() >= tokens
                    and allocator.swa_available_size() >= tokens)
    return bool(allocator.available_size() >= tokens)


def mamba_slots_needed(pool: Any, reqs: Sequence[MambaReq]) -> int:
    return sum((req.kv.mamba_pool_idx is None) + (pool.mamba_initial_tracking_slots
                                                  if req.kv.mamba_ping_pong_track_buffer is None
                                                  else 0) for req in reqs)


def ensure_mamba_capacity(pool: Any, reqs: Sequence[MambaReq], cache: Any) -> bool:
    """Evict states until the requests' new Mamba slots fit; whether they do."""
    needed = mamba_slots_needed(pool, reqs)
    available = pool.mamba_allocator.available_size()
    if available < needed:
        cache.evict_for_alloc(EvictParams(num_tokens=0, mamba_num=needed - available))
    return bool(pool.mamba_allocator.available_size() >= needed)


def admit(cache: Any, req: MambaReq, *, chunk: int | None = None) -> torch.Tensor:
    """Admission and the prefill allocation (of its first ``chunk`` tokens past the hit
    with chunked prefill); the new FULL slots.  ``MemoryError`` when a pool is short (undo
    it with ``undo_admit``)."""
    pool = cache.req_to_token_pool
    fill = req.full_untruncated_fill_ids
    found = cache.match_prefix(MatchPrefixParams(key=RadixKey(fill, limit=len(fill) - 1),
                                                 cow_mamba=True, req=req))
    req.prefix_len = found.device_prefix_len
    req.last_node = found.last_device_node
    req.swa_branching_seqlen = found.swa_branching_seqlen
    req.mamba_branching_seqlen = found.mamba_branching_seqlen
    req.kv.cache_protected_len = req.prefix_len
    req.lock = cache.lock(req.last_node)
    if not ensure_mamba_capacity(pool, [req], cache):
        raise MemoryError("no room for the request's Mamba slots")
    if not pool.alloc([req]):
        raise MemoryError("no free request row")
    req.kv.kv_allocated_len = req.prefix_len
    end = len(fill) if chunk is None else min(len(fill), req.prefix_len + chunk)
    return _extend(cache, req, end, req.prefix_len)


def extend_chunk(cache: Any, req: MambaReq, chunk: int) -> torch.Tensor:
    """The next chunk of a chunked prefill (after its checkpoint): up to ``chunk`` more
    tokens; the new FULL slots.  ``MemoryError`` when the pool is short."""
    end = min(len(req.full_untruncated_fill_ids), req.kv.kv_allocated_len + chunk)
    return _extend(cache, req, end)


def _extend(cache: Any, req: MambaReq, end: int, prefix_len: int | None = None) -> torch.Tensor:
    """0.5.23's ``alloc_for_extend`` after the row, as one decision
    (``UnifiedRadixCache.alloc_for_extend``): the shortfall evicted, row positions up to
    ``end`` allocated and written (at admission after the hit's ``prefix_len`` slots);
    then the extend tracked."""
    step = cache.alloc_for_extend(req, end, prefix_len=prefix_len)
    if step.stopped == NO_SWA_PAGE:
        raise ValueError("a prefill continues a page that has no SWA page")
    if step.stopped is not None:
        raise MemoryError("prefill out of memory")
    req.kv.kv_allocated_len = req.kv.kv_committed_len = end
    req.extend_end = end
    track_extend(cache, req)
    return int64_tensor(step.slots)


def undo_admit(cache: Any, req: MambaReq) -> None:
    """An admission that did not fit: its Mamba slots, its row and its lock go back."""
    pool = cache.req_to_token_pool
    if req.kv.mamba_pool_idx is not None:
        pool.free_mamba_cache(req)
    if req.kv.req_pool_idx is not None:
        pool.free(req.kv.req_pool_idx)
        req.kv.req_pool_idx = None
    cache.unlock(req.lock)
    req.lock = None


def track_extend(cache: Any, req: MambaReq) -> None:
    """0.5.23's extend tracking (extra buffer): the last grid boundary of the extend, or
    the branch point when it lies inside the extend on the chunk grid, becomes the
    request's tracked checkpoint, in the next ping-pong slot."""
    if not cache.enable_mamba_extra_buffer:
        return
    grid, chunk = cache.mamba_checkpoint_grid, cache.mamba_cache_chunk_size
    prefix, end = req.prefix_len, req.extend_end
    extend = end - prefix
    if extend < grid:
        return
    aligned = prefix + extend // grid * grid
    model_chunk = cache.mamba_chunk_size  # off its grid, the state is read mid-extend
    track_at = end if prefix + extend // model_chunk * model_chunk == aligned else aligned + 1
    kv, pool = req.kv, cache.req_to_token_pool
    kv.mamba_last_track_idx = kv.mamba_next_track_idx
    kv.mamba_next_track_idx = pool.get_mamba_ping_pong_other_idx(kv.mamba_next_track_idx)
    branch = req.mamba_branching_seqlen
    if branch is not None and prefix < branch < track_at and (branch - prefix) % chunk == 0:
        aligned = branch
    kv.mamba_last_track_seqlen = aligned


def track_decode(cache: Any, req: MambaReq) -> None:
    """0.5.23's decode tracking (extra buffer): a length on the track grid is tracked in
    the next ping-pong slot, the previous checkpoint remembered."""
    kv = req.kv
    if not cache.enable_mamba_extra_buffer or kv.mamba_ping_pong_track_buffer is None:
        return
    if kv.kv_committed_len % cache.mamba_track_grid:
        return
    slot_index = kv.mamba_next_track_idx
    kv.mamba_prev_track_seqlen = kv.mamba_last_track_seqlen
    kv.mamba_last_track_seqlen = kv.kv_committed_len
    kv.mamba_last_track_idx = slot_index
    kv.mamba_next_track_idx = cache.req_to_token_pool.get_mamba_ping_pong_other_idx(slot_index)


def prefill_done(cache: Any, req: MambaReq, token: int, *, finished: bool = False) -> None:
    """The prefill's output token; an unfinished request checkpoints what it computed."""
    req.output_ids.append(token)
    if finished:
        req.finished_reason = "length"
        return
    checkpoint_kv_cache(req, cache)
    req.decode_batch_idx = 0


def decode_step(cache: Any, reqs: Sequence[MambaReq], token: int, *,
                interval: int = SWA_EVICTION_INTERVAL) -> list[int]:
    """One decode step of ``reqs``: slide their SWA windows, then one slot each (one
    decision: ``alloc_for_decode``), then the decode tracking."""
    step = cache.alloc_for_decode(reqs, eviction_interval=interval)
    for req in reqs[: len(step.slots)]:
        req.kv.kv_allocated_len += 1
        req.kv.kv_committed_len += 1
        req.output_ids.append(token)
        req.decode_batch_idx += 1
        track_decode(cache, req)
    if step.stopped == NO_SWA_PAGE:
        raise ValueError("a decode continues a page that has no SWA page")
    if step.stopped is not None:
        raise MemoryError("decode out of memory")
    return list(step.slots)


def finish(cache: Any, req: MambaReq) -> None:
    """The request finished: cache it and give its row and slots back."""
    req.finished_reason = "length"
    cache.release_kv_cache(req, checkpoint=True)


def abort(cache: Any, req: MambaReq) -> None:
    """The request was aborted: give everything back without caching it."""
    req.finished_reason = "abort"
    cache.release_kv_cache(req, checkpoint=False)


__all__ = ["abort", "admit", "decode_step", "ensure_mamba_capacity", "evict_to_free_tokens",
           "extend_chunk", "finish", "pools_fit", "prefill_done", "track_decode", "track_extend",
           "undo_admit"]
