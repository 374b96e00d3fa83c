"""Adapter: kvstate's SGLang front end for the peer harness (../shared/peers/sim.py).

Same interface as the harness's ``peer_sglang`` adapter, and the same call
sequence SGLang 0.5.23's scheduler makes, through kvstate's public
``kvstate.sglang`` objects only:

  admission: ``RadixCache.match_prefix(MatchPrefixParams(RadixKey(prompt,
             limit=P-1)))`` and ``lock``; per step one batched extend:
             ``ReqToTokenPool.alloc``, evict the shortfall, ``alloc`` /
             ``alloc_extend``, ``req_to_token`` writes (prefix, new slots);
             after the prefill token ``RadixCache.checkpoint(req, up_to=P)``.
  decode:    evict the shortfall, ``alloc`` / ``alloc_decode`` for the whole
             running batch, one batched ``write((rows, positions), slots)``.
  finish:    ``checkpoint(req, up_to=owned)``, ``free_kv_row`` (the tail page
             the row still maps: ``FreeMapped``), ``unlock``, ``ReqToTokenPool.free``.

    PYTHONPATH=tools python ../shared/peers/sim.py --peer peer_kvstate_sglang --page-size 16

``KVSTATE_RECORD=FILE`` attaches a ``kvstate.log.Recorder`` writing every
event to FILE (closed at exit).
"""

from __future__ import annotations

import atexit
import os
from array import array
from typing import Any

import torch

import kvstate
from kvstate.engine import Engine
from kvstate.sglang import (
    CacheInitParams,
    EvictParams,
    MatchPrefixParams,
    PagedTokenToKVPoolAllocator,
    RadixCache,
    RadixKey,
    Req,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from kvstate.state import Geometry

_EMPTY = torch.empty((0,), dtype=torch.int64)


class SimReq(Req):
    """kvstate's ``Req`` plus what the harness's scheduler keeps per request."""

    def __init__(self, rid: Any, prompt: list[int]) -> None:
        super().__init__(rid, prompt)
        self.key_ids = array("q", prompt)  # what SGLang keys the tree with
        self.prefix_len = 0
        self.kv_allocated_len = 0


class Peer:
    name = "kvstate-sglang"
    version = kvstate.__version__

    def __init__(self, capacity_tokens: int, page_size: int, max_running: int,
                 max_context: int) -> None:
        self.ps = page_size
        self.capacity_tokens = capacity_tokens
        engine = Engine(Geometry(num_pages=1), keep_events=False)
        self.r2t = ReqToTokenPool(size=max_running, max_context_len=max_context, engine=engine)
        self.alloc: TokenToKVPoolAllocator
        if page_size == 1:
            self.alloc = TokenToKVPoolAllocator(capacity_tokens, engine=engine)
        else:
            self.alloc = PagedTokenToKVPoolAllocator(capacity_tokens, page_size, engine=engine)
        self.tree = RadixCache(CacheInitParams(disable=False, req_to_token_pool=self.r2t,
                                               token_to_kv_pool_allocator=self.alloc,
                                               page_size=page_size))
        self.name = f"{self.name}-ps{page_size}"
        self.pending: list[SimReq] = []
        self._evicted = 0
        path = os.environ.get("KVSTATE_RECORD")
        if path:
            from kvstate.log.recorder import Recorder

            self.recorder = Recorder(engine, path, meta={"front_end": "kvstate.sglang",
                                                         "driver": "peer_kvstate_sglang"})
            atexit.register(self.recorder.close)

    def _evict_for(self, num_tokens: int) -> None:
        """0.5.23's evict_from_tree_cache: evict the shortfall only."""
        shortfall = num_tokens - self.alloc.available_size()
        if shortfall > 0:
            self._evicted += self.tree.evict(EvictParams(num_tokens=shortfall)).num_tokens_evicted

    # -- lifecycle -------------------------------------------------------
    def create(self, r: Any) -> SimReq:
        return SimReq(r.rid, r.prompt)

    def match(self, req: SimReq) -> int:
        key = RadixKey(req.key_ids, None, limit=len(req.key_ids) - 1)
        res = self.tree.match_prefix(MatchPrefixParams(key=key))
        req.prefix_len = res.device_prefix_len
        req.last_node = res.last_device_node
        return req.prefix_len

    def admit(self, req: SimReq) -> bool:
        req.lock = self.tree.lock(req.last_node)  # PrefillAdder takes the tree lock
        req.cache_protected_len = req.prefix_len
        self.pending.append(req)
        return True

    def flush_admissions(self) -> None:
        reqs, self.pending = self.pending, []
        if not reqs:
            return
        tree, r2t, alloc, ps = self.tree, self.r2t, self.alloc, self.ps
        prefixes = [tree.path_device_indices(r.last_node)[: r.prefix_len] if r.prefix_len else _EMPTY
                    for r in reqs]
        prefix_lens = [r.prefix_len for r in reqs]
        seq_lens = [len(r.origin_input_ids) for r in reqs]
        extend_num = sum(seq_lens) - sum(prefix_lens)
        rows = r2t.alloc(len(reqs))
        if rows is None:
            raise RuntimeError("kvstate: req slots exhausted")
        for r, row in zip(reqs, rows, strict=True):
            r.req_pool_idx = row
        if ps == 1:
            self._evict_for(extend_num)
            out = alloc.alloc(extend_num)
        else:
            last_loc = torch.tensor([int(t[-1]) if len(t) else -1 for t in prefixes])
            self._evict_for(extend_num + len(reqs) * ps)
            prefix_t = torch.tensor(prefix_lens)
            seq_t = torch.tensor(seq_lens)
            out = alloc.alloc_extend(prefix_t, prefix_t, seq_t, seq_t, last_loc, extend_num)
        if out is None:
            raise RuntimeError("kvstate: prefill OOM")
        at = 0
        for r, row, pl, sl, pre in zip(reqs, rows, prefix_lens, seq_lens, prefixes, strict=True):
            r2t.write((row, slice(0, pl)), pre)
            r2t.write((row, slice(pl, sl)), out[at: at + sl - pl])
            at += sl - pl
            r.kv_allocated_len = sl

    def append_first(self, req: SimReq, tok: int, done: bool) -> None:
        req.output_ids.append(tok)
        if not done:  # a prefill that did not finish the request is published right away
            self.tree.checkpoint(req, up_to=len(req.origin_input_ids))
            req.prefix_len = len(req.origin_input_ids)

    def decode_alloc(self, reqs: list[SimReq]) -> None:
        alloc, ps = self.alloc, self.ps
        rows = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64)
        seq_lens = torch.tensor([r.kv_allocated_len for r in reqs], dtype=torch.int64)
        if ps == 1:
            self._evict_for(len(reqs))
            out = alloc.alloc(len(reqs))
        else:
            last_loc = self.r2t.req_to_token[rows, seq_lens - 1]
            self._evict_for(len(reqs) * ps)
            nxt = seq_lens + 1
            out = alloc.alloc_decode(nxt, nxt, last_loc)
        if out is None:
            raise RuntimeError("kvstate: decode OOM (would retract)")
        self.r2t.write((rows, seq_lens), out.to(torch.int32))
        for r in reqs:
            r.kv_allocated_len += 1

    def append(self, req: SimReq, tok: int) -> None:
        req.output_ids.append(tok)

    def finish(self, req: SimReq, final_len: int) -> None:
        assert req.kv_allocated_len == final_len, (req.kv_allocated_len, final_len)
        self.tree.checkpoint(req, up_to=final_len)
        self.tree.free_kv_row(req, [(req.cache_protected_len, final_len)])
        self.tree.unlock(req.lock)
        req.lock = None
        self.r2t.free(req)

    # -- stats -----------------------------------------------------------
    def avail_tokens(self) -> int:
        return self.alloc.available_size() + self.tree.evictable_size()

    def used_tokens(self) -> int:
        return self.capacity_tokens - self.avail_tokens()

    def evicted_tokens(self) -> int:
        return self._evicted
