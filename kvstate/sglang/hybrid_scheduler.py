"""The scheduler steps SGLang 0.5.23 runs around a ``UnifiedRadixCache(FULL, SWA)``.

Owned by the caller, like SGLang's scheduler: these functions only call the
kvstate front end (``ReqToTokenPool``, ``SWATokenToKVPoolAllocator``,
``UnifiedRadixCache``) in 0.5.23's order, so a run is comparable call for
call with SGLang's (``tools/diff_sglang_hybrid.py``):

* ``admit``: match the fill ids up to ``input_len - 1`` (the last token is
  always computed), lock the hit, take a row, then as one decision
  (``UnifiedRadixCache.alloc_for_extend``) evict each pool's shortfall (a
  page more with pages, as ``alloc_extend`` is asked), allocate the extend
  and write it into the row after the hit's slots; ``undo_admit`` gives the
  row and the lock back when it raised ``MemoryError``;
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
from kvstate.sglang.inputs import int64_tensor
from kvstate.sglang.params import MatchPrefixParams, RadixKey
from kvstate.sglang.unified_flows import SWA_EVICTION_INTERVAL, checkpoint_kv_cache, release_kv_cache


def admit(cache: Any, req: HybridReq) -> torch.Tensor:
    """Admission and the prefill allocation; the new FULL slots."""
    pool = cache.req_to_token_pool
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
    req.kv.req_pool_idx = rows[0]
    length = len(fill)
    step = cache.alloc_for_extend(req, length, prefix_len=req.prefix_len)
    if step.stopped == NO_SWA_PAGE:
        raise ValueError("a prefill continues a page that has no SWA page")
    if step.stopped is not None:
        raise MemoryError("prefill out of memory")
    req.kv.kv_allocated_len = req.kv.kv_committed_len = length
    req.extend_end = length
    return int64_tensor(step.slots)


def undo_admit(cache: Any, req: HybridReq) -> None:
    """An admission that did not fit: its row and its lock go back."""
    if req.kv.req_pool_idx is not None:
        cache.req_to_token_pool.free(req.kv.req_pool_idx)
        req.kv.req_pool_idx = None
    if req.lock is not None:
        cache.unlock(req.lock)
        req.lock = None


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
