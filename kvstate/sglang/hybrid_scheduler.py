"""The scheduler steps SGLang 0.5.23 runs around a ``UnifiedRadixCache(FULL, SWA)``.

Owned by the caller, like SGLang's scheduler: these functions only call the
kvstate front end (``ReqToTokenPool``, ``SWATokenToKVPoolAllocator``,
``UnifiedRadixCache``) in 0.5.23's order, so a run is comparable call for
call with SGLang's (``tools/diff_sglang_hybrid.py``):

* ``admit``: match the fill ids up to ``input_len - 1`` (the last token is
  always computed), lock the hit, take a row, evict each pool's shortfall,
  allocate the extend (``alloc`` with page size 1; ``alloc_extend`` with
  pages, evicting ``extend + page``), write the row;
* ``prefill_done``: the first output token, then the unfinished checkpoint;
* ``decode_step``: the out-of-window SWA frees of ``maybe_evict_swa``, then one
  token per request (evicting one page's worth first), as one decision;
* ``finish``: ``release_kv_cache`` with the finishing checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvstate.planner.swa_decode import NO_SWA_PAGE
from kvstate.sglang.hybrid_req import HybridReq
from kvstate.sglang.params import MatchPrefixParams, RadixKey
from kvstate.sglang.unified_flows import SWA_EVICTION_INTERVAL, checkpoint_kv_cache, release_kv_cache


def admit(cache: Any, req: HybridReq) -> torch.Tensor:
    """Admission and the prefill allocation; the new FULL slots."""
    allocator, pool = cache.token_to_kv_pool_allocator, cache.req_to_token_pool
    fill = req.full_untruncated_fill_ids
    found = cache.match_prefix(MatchPrefixParams(key=RadixKey(fill, limit=len(fill) - 1)))
    req.prefix_len = found.device_prefix_len
    req.last_node = found.last_device_node
    req.swa_branching_seqlen = found.swa_branching_seqlen
    req.kv.cache_protected_len = req.prefix_len
    req.lock = cache.lock(req.last_node)
    rows = pool.alloc(1)
    if not rows:
        raise RuntimeError("no free request row")
    row = req.kv.req_pool_idx = rows[0]
    prefix = cache.prefix_device_indices(req)
    length, size = len(fill), allocator.page_size
    extend = length - req.prefix_len
    if size == 1:
        allocator.evict_to_free_tokens(cache, extend)
        out = allocator.alloc(extend)
    else:
        last = prefix[-1:] if req.prefix_len else torch.full((1,), -1, dtype=torch.int64)
        allocator.evict_to_free_tokens(cache, extend + size)
        lens = torch.tensor([req.prefix_len]), torch.tensor([length])
        out = allocator.alloc_extend(lens[0], lens[0], lens[1], lens[1], last, extend)
    if out is None:
        raise MemoryError("prefill out of memory")
    if req.prefix_len:
        pool.write((row, slice(0, req.prefix_len)), prefix)
    pool.write((row, slice(req.prefix_len, length)), out)
    req.kv.kv_allocated_len = req.kv.kv_committed_len = length
    req.extend_end = length
    return out


def prefill_done(cache: Any, req: HybridReq, token: int, *, finished: bool = False) -> None:
    """The prefill's output token; an unfinished request checkpoints what it computed."""
    req.output_ids.append(token)
    if finished:
        req.finished_reason = "length"
        return
    checkpoint_kv_cache(req, cache)
    req.decode_batch_idx = 0


def decode_step(cache: Any, reqs: Sequence[HybridReq], token: int, *,
                interval: int = SWA_EVICTION_INTERVAL) -> list[int]:
    """One decode step of ``reqs``: slide their windows, then one slot each (one decision:
    ``UnifiedRadixCache.alloc_for_decode``)."""
    step = cache.alloc_for_decode(reqs, eviction_interval=interval)
    for req in reqs[: len(step.slots)]:
        req.kv.kv_allocated_len += 1
        req.kv.kv_committed_len += 1
        req.output_ids.append(token)
        req.decode_batch_idx += 1
    if step.stopped == NO_SWA_PAGE:
        raise ValueError("a decode continues a page that has no SWA page")
    if step.stopped is not None:
        raise MemoryError("decode out of memory")
    return list(step.slots)


def finish(cache: Any, req: HybridReq) -> None:
    """The request finished: cache it and give its row back."""
    req.finished_reason = "length"
    release_kv_cache(req, cache, checkpoint=True)


__all__ = ["admit", "decode_step", "finish", "prefill_done"]
