"""The two sides of ``tools/diff_sglang_hybrid.py``: SGLang 0.5.23 and kvstate, one op list.

``python tools/hybrid_sides.py {sglang|kvstate} BACKEND PAGE SEED[,SEED...] STEPS``
prints one JSON trace per seed.  The SGLang side runs in the peer venv
(``$PEERS/venv-sglang``) with BACKEND ``python`` or ``rust`` (its tree core);
the kvstate side ignores BACKEND.  A side interprets the ops of
``diff_sglang_hybrid.generate`` with its own objects and, after each op,
records what the op returned and a snapshot: both free lists in order, the
nonzero ``full_to_swa_index_mapping`` entries, the four component sizes and
every running request's row, cursor and lock.  With SGLang's Python core it
also records the tree (keys, FULL and SWA slots, both lock counts, whether a
window receipt sits there) and the SWA LRU, node by node as root paths.
"""

from __future__ import annotations

import json
import os
import sys
from array import array
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from diff_sglang_hybrid import FULL_PAGES, ROWS, SWA_PAGES, WIDTH, generate  # noqa: E402

PEERS_DIR = Path(os.environ.get("PEERS_HARNESS", HERE.parent.parent / "shared" / "peers"))


class Side:
    def __init__(self, kind: str, backend: str, page_size: int, window: int) -> None:
        import torch

        self.torch, self.kind, self.ps, self.window = torch, kind, page_size, window
        self.backend = backend
        self.pool: Any = None  # SGLang's objects or kvstate's, called the same way
        self.alloc: Any = None
        self.cache: Any = None
        full, swa = FULL_PAGES * page_size, SWA_PAGES * page_size
        if kind == "sglang":
            self._build_sglang(full, swa, backend)
        else:
            from kvstate.sglang.hybrid_req import HybridCacheInitParams
            from kvstate.sglang.pool import ReqToTokenPool
            from kvstate.sglang.swa_allocator import SWATokenToKVPoolAllocator
            from kvstate.sglang.unified_radix_cache import UnifiedRadixCache

            self.pool = ReqToTokenPool(ROWS, WIDTH)
            self.alloc = SWATokenToKVPoolAllocator(full, swa, page_size)
            self.cache = UnifiedRadixCache(HybridCacheInitParams(
                self.pool, self.alloc, page_size, window))
        self.locks: list[Any] = []
        self.running: list[Any] = []  # admitted and prefilled, in admission order

    def _build_sglang(self, full: int, swa: int, backend: str) -> None:
        sys.path.insert(0, str(PEERS_DIR))
        import peer_stubs

        peer_stubs.install()
        import torch
        from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

        set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=self.ps))
        self.SWA = ComponentType.SWA
        self.pool = ReqToTokenPool(size=ROWS, max_context_len=WIDTH, device="cpu",
                                   enable_memory_saver=False)
        kv = SWAKVPool(size=full, size_swa=swa, page_size=self.ps, dtype=torch.bfloat16,
                       head_num=1, head_dim=4, swa_attention_layer_ids=[0],
                       full_attention_layer_ids=[1], device="cpu")
        self.alloc = SWATokenToKVPoolAllocator(full, swa, self.ps, torch.bfloat16, "cpu", kv,
                                               False, req_to_token_pool=self.pool)
        params = CacheInitParams(req_to_token_pool=self.pool, token_to_kv_pool_allocator=self.alloc,
                                 page_size=self.ps, disable=False, sliding_window_size=self.window,
                                 tree_components=(ComponentType.FULL, ComponentType.SWA),
                                 tree_core_backend=backend)
        self.cache = UnifiedRadixCache(params)

    # -- API shims: the same call on either side ----------------------------------------
    def api(self) -> Any:
        if self.kind == "sglang":
            from sglang.srt.mem_cache import base_prefix_cache as api
            from sglang.srt.mem_cache.radix_cache import RadixKey
        else:
            from kvstate.sglang import params as api
            from kvstate.sglang.params import RadixKey
        return api, RadixKey

    def match(self, tokens: list[int]) -> Any:
        api, key = self.api()
        return self.cache.match_prefix(api.MatchPrefixParams(key=key(array("q", tokens))))

    def hit(self, result: Any) -> list[Any]:
        slots = self.cache.path_device_indices(result.last_device_node)[: result.device_prefix_len]
        return [int(result.device_prefix_len), int(result.full_kv_hit_length),
                result.swa_branching_seqlen, slots.tolist()]

    def bare_alloc(self, n: int) -> Any:
        if self.kind == "kvstate" or self.ps == 1:
            return self.alloc.alloc(n)
        full = self.alloc.full_attn_allocator.alloc(n)
        self.alloc.set_full_to_swa_mapping(full, self.alloc.swa_attn_allocator.alloc(n))
        return full

    def insert(self, tokens: list[int], value: Any) -> Any:
        api, key = self.api()
        return self.cache.insert(api.InsertParams(key=key(array("q", tokens)), value=value))

    def evict(self, full: int, swa: int, for_alloc: bool) -> list[int]:
        api, _ = self.api()
        params = api.EvictParams(num_tokens=full, swa_num_tokens=swa)
        result = self.cache.evict_for_alloc(params) if for_alloc else self.cache.evict(params)
        return [int(result.num_tokens_evicted), int(result.swa_num_tokens_evicted)]

    def receipt(self, lock: Any) -> Any:
        uuids = lock.receipt.component_lock_uuids
        key = self.SWA if self.kind == "sglang" else "SWA"
        return None if key not in uuids else uuids[key] is not None

    # -- snapshot -------------------------------------------------------------------------
    def snapshot(self) -> list[Any]:
        a, cache = self.alloc, self.cache
        mapping = a.full_to_swa_index_mapping
        nonzero = (mapping[:-1] != 0).nonzero().reshape(-1).tolist()
        rows = []
        for req in self.running:
            kv = req.kv
            row = self.pool.req_to_token[kv.req_pool_idx, : kv.kv_allocated_len].tolist()
            rows.append([kv.req_pool_idx, row, kv.cache_protected_len,
                         kv.get_evicted_seqlen(self.swa_key()), req.swa_branching_seqlen,
                         self.receipt(req.lock) if req.lock is not None else "none"])
        out = [a.full_attn_allocator.free_pages.tolist(), a.swa_attn_allocator.free_pages.tolist(),
               [[i, int(mapping[i])] for i in nonzero],
               [cache.full_evictable_size(), cache.full_protected_size(),
                cache.swa_evictable_size(), cache.swa_protected_size()], rows]
        if self.backend == "python" or self.kind == "kvstate":
            out.append(self.tree())
        return out

    def swa_key(self) -> Any:
        return self.SWA if self.kind == "sglang" else "SWA"

    def tree(self) -> list[Any]:
        """Every node as (root path tokens, FULL slots, SWA slots or None, FULL lock, SWA
        lock, has a receipt) in path order, then the SWA LRU from most recent, as paths."""
        from tree_dumps import kvstate_tree, sglang_tree

        return sglang_tree(self.cache) if self.kind == "sglang" else kvstate_tree(self.cache)


def run_seed(kind: str, backend: str, page_size: int, seed: int, steps: int) -> list[Any]:
    from hybrid_ops import apply_op

    window, interval, ops = generate(seed, steps, page_size)
    side = Side(kind, backend, page_size, window)
    trace: list[Any] = []
    for op in ops:
        result = apply_op(side, op, interval)
        trace.append([op[0], result, side.snapshot()])
        if kind == "kvstate":  # every named invariant after every op (a violation diverges)
            from kvstate.invariants import check

            found = check(side.cache.engine.view)
            if found:
                trace.append(["VIOLATION", [str(v) for v in found[:3]], None])
    return trace


def main() -> int:
    kind, backend, page_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    seeds, steps = [int(s) for s in sys.argv[4].split(",")], int(sys.argv[5])
    for seed in seeds:
        print(json.dumps([seed, run_seed(kind, backend, page_size, seed, steps)]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
