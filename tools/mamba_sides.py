"""The two sides of ``tools/diff_sglang_mamba.py``: SGLang 0.5.23 and kvstate, one op list.

``python tools/mamba_sides.py {sglang|kvstate} BACKEND CONFIG PAGE SEED[,SEED...] STEPS``
prints one JSON trace per seed.  The SGLang side runs in the peer venv with
BACKEND ``python`` or ``rust`` (its tree core); the kvstate side ignores
BACKEND.  A side builds the configuration's pools and tree, interprets the
ops of ``diff_sglang_mamba.generate`` (``tools/mamba_ops.py``) and, after
each op, records what it returned and a snapshot: the free lists in order
(FULL, SWA, Mamba), the nonzero FULL -> SWA mapping entries, the six sizes,
every running request's row, cursors, Mamba slots, tracked lengths and both
Mamba mapping entries; with SGLang's Python core (and on kvstate) also the
tree (``tools/tree_dumps_mamba.py``).
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
from diff_sglang_mamba import CONFIGS, ROWS, WIDTH, generate  # noqa: E402

PEERS_DIR = Path(os.environ.get("PEERS_HARNESS", HERE.parent.parent / "shared" / "peers"))


class Side:
    def __init__(self, kind: str, backend: str, setup: dict[str, Any]) -> None:
        self.kind, self.backend, self.setup = kind, backend, setup
        self.ps, self.window = setup["page"], setup["window"]
        self.has_swa, self.extra, _ = CONFIGS[setup["config"]]
        self.pool: Any = None
        self.alloc: Any = None
        self.cache: Any = None
        self.SWA: Any = "SWA"
        if kind == "sglang":
            self._build_sglang()
        else:
            self._build_kvstate()
        self.locks: list[Any] = []
        self.running: list[Any] = []  # admitted requests, in admission order

    def _build_kvstate(self) -> None:
        from kvstate.sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
        from kvstate.sglang.mamba_pool import HybridReqToTokenPool
        from kvstate.sglang.mamba_radix_cache import MambaCacheInitParams
        from kvstate.sglang.swa_allocator import SWATokenToKVPoolAllocator
        from kvstate.sglang.unified_radix_cache import UnifiedRadixCache

        s, ps = self.setup, self.ps
        full = s["full_pages"] * ps
        self.pool = HybridReqToTokenPool(size=ROWS, mamba_size=s["mamba_slots"],
                                         max_context_len=WIDTH,
                                         enable_mamba_extra_buffer=self.extra)
        if self.has_swa:
            self.alloc = SWATokenToKVPoolAllocator(full, s["swa_pages"] * ps, ps)
        else:
            self.alloc = TokenToKVPoolAllocator(full) if ps == 1 else \
                PagedTokenToKVPoolAllocator(full, ps)
        components = ("FULL", "SWA", "MAMBA") if self.has_swa else ("FULL", "MAMBA")
        self.cache = UnifiedRadixCache(MambaCacheInitParams(
            req_to_token_pool=self.pool, token_to_kv_pool_allocator=self.alloc, page_size=ps,
            sliding_window_size=self.window, tree_components=components,
            enable_mamba_extra_buffer=self.extra, mamba_chunk_size=s["chunk"],
            mamba_track_interval=s["track_interval"]))

    def _build_sglang(self) -> None:
        sys.path.insert(0, str(PEERS_DIR))
        import peer_stubs

        peer_stubs.install()
        import torch
        from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
        from sglang.srt.environ import envs
        from sglang.srt.mem_cache.allocator import (
            PagedTokenToKVPoolAllocator,
            TokenToKVPoolAllocator,
        )
        from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool
        from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

        s, ps, bf16 = self.setup, self.ps, torch.bfloat16
        args = ServerArgs(model_path="dummy", page_size=ps)
        args._mamba_cache_chunk_size = max(s["chunk"], ps)
        args.mamba_track_interval = s["track_interval"]
        set_global_server_args_for_scheduler(args)
        self.SWA = ComponentType.SWA
        with envs.SGLANG_MAMBA_SSM_DTYPE.override("bfloat16"):
            shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=32, n_groups=1,
                                            num_heads=2, head_dim=16, state_size=4, conv_kernel=4)
            params = Mamba2CacheParams(shape=shape, layers=[0])
        self.pool = HybridReqToTokenPool(
            size=ROWS, mamba_size=s["mamba_slots"], mamba_spec_state_size=ROWS,
            max_context_len=WIDTH, device="cpu", enable_memory_saver=False, cache_params=params,
            mamba_layer_ids=[0], enable_mamba_extra_buffer=self.extra, enable_overlap_schedule=True)
        full = s["full_pages"] * ps
        components = [ComponentType.FULL]
        if self.has_swa:
            swa = s["swa_pages"] * ps
            kv = SWAKVPool(size=full, size_swa=swa, page_size=ps, dtype=bf16, head_num=1,
                           head_dim=4, swa_attention_layer_ids=[1], full_attention_layer_ids=[2],
                           device="cpu")
            self.alloc = SWATokenToKVPoolAllocator(full, swa, ps, bf16, "cpu", kv, False,
                                                   req_to_token_pool=self.pool)
            components.append(ComponentType.SWA)
        else:
            kv = HybridLinearKVPool(size=full, dtype=bf16, page_size=ps, head_num=1, head_dim=8,
                                    full_attention_layer_ids=[1], device="cpu",
                                    enable_memory_saver=False, mamba_pool=self.pool.mamba_pool)
            self.alloc = (TokenToKVPoolAllocator(full, bf16, "cpu", kv, need_sort=False)
                          if ps == 1 else
                          PagedTokenToKVPoolAllocator(full, ps, bf16, "cpu", kv, need_sort=False))
        components.append(ComponentType.MAMBA)
        self.cache = UnifiedRadixCache(CacheInitParams(
            req_to_token_pool=self.pool, token_to_kv_pool_allocator=self.alloc, page_size=ps,
            disable=False, sliding_window_size=self.window, tree_components=tuple(components),
            enable_mamba_extra_buffer=self.extra, tree_core_backend=self.backend))

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
                result.swa_branching_seqlen, result.mamba_branching_seqlen, slots.tolist()]

    def full_free(self) -> int:
        return int(self.alloc.full_available_size() if self.has_swa else
                   self.alloc.available_size())

    def bare_alloc(self, n: int) -> Any:
        if self.kind == "kvstate" or self.ps == 1 or not self.has_swa:
            return self.alloc.alloc(n)
        full = self.alloc.full_attn_allocator.alloc(n)
        self.alloc.set_full_to_swa_mapping(full, self.alloc.swa_attn_allocator.alloc(n))
        return full

    def insert(self, tokens: list[int], value: Any, state: Any) -> Any:
        api, key = self.api()
        return self.cache.insert(api.InsertParams(key=key(array("q", tokens)), value=value,
                                                  mamba_value=state))

    def evict(self, full: int, swa: int, mamba: int, for_alloc: bool) -> list[int]:
        api, _ = self.api()
        params = api.EvictParams(num_tokens=full, swa_num_tokens=swa, mamba_num=mamba)
        result = self.cache.evict_for_alloc(params) if for_alloc else self.cache.evict(params)
        return [int(result.num_tokens_evicted), int(result.swa_num_tokens_evicted),
                int(result.mamba_num_evicted)]

    def receipt(self, lock: Any) -> Any:
        uuids = lock.receipt.component_lock_uuids
        return None if self.SWA not in uuids else uuids[self.SWA] is not None

    # -- snapshot -------------------------------------------------------------------------
    def snapshot(self) -> list[Any]:
        a, cache, pool = self.alloc, self.cache, self.pool
        if self.has_swa:
            mapping = a.full_to_swa_index_mapping
            nonzero = (mapping[:-1] != 0).nonzero().reshape(-1).tolist()
            free = [a.full_attn_allocator.free_pages.tolist(),
                    a.swa_attn_allocator.free_pages.tolist(),
                    [[i, int(mapping[i])] for i in nonzero]]
            swa_sizes = [cache.swa_evictable_size(), cache.swa_protected_size()]
        else:
            full_free = (a.free_pages.tolist() if self.kind == "sglang"
                         else list(cache.engine.view.free_pages))
            free, swa_sizes = [full_free, None, None], [0, 0]
        sizes = [cache.full_evictable_size(), cache.full_protected_size(), *swa_sizes,
                 cache.mamba_evictable_size(), cache.mamba_protected_size()]
        out = [*free, pool.mamba_allocator.free_slots.tolist(), sizes,
               [self.request(req) for req in self.running]]
        if self.backend == "python" or self.kind == "kvstate":
            from tree_dumps_mamba import kvstate_tree, sglang_tree

            out.append(sglang_tree(cache) if self.kind == "sglang" else kvstate_tree(cache))
        return out

    def request(self, req: Any) -> list[Any]:
        kv, pool = req.kv, self.pool
        row = kv.req_pool_idx

        def value(x: Any) -> Any:
            return None if x is None else (x.tolist() if hasattr(x, "tolist") else x)

        track = pool.req_index_to_mamba_ping_pong_track_buffer_mapping[row].tolist() \
            if self.extra else None
        return [row, pool.req_to_token[row, : kv.kv_allocated_len].tolist(),
                kv.cache_protected_len,
                kv.get_evicted_seqlen(self.SWA) if self.has_swa else None,
                req.swa_branching_seqlen if self.has_swa else None, req.mamba_branching_seqlen,
                value(kv.mamba_pool_idx), value(kv.mamba_ping_pong_track_buffer),
                kv.mamba_next_track_idx, kv.mamba_last_track_idx, kv.mamba_last_track_seqlen,
                kv.mamba_prev_track_seqlen, int(pool.req_index_to_mamba_index_mapping[row]),
                track, self.receipt(req.lock) if req.lock is not None else "none",
                bool(req.finished())]


def run_seed(kind: str, backend: str, config: str, page_size: int, seed: int,
             steps: int) -> list[Any]:
    from mamba_ops import apply_op

    setup, ops = generate(config, seed, steps, page_size)
    side = Side(kind, backend, setup)
    trace: list[Any] = []
    for op in ops:
        result = apply_op(side, op)
        trace.append([op[0], result, side.snapshot()])
        if kind == "kvstate":  # every named invariant after every op (a violation diverges)
            from kvstate.invariants import check

            found = check(side.cache.engine.view) + side.pool.verify()
            if found:
                trace.append(["VIOLATION", [str(v) for v in found[:3]], None])
    return trace


def main() -> int:
    kind, backend, config, page_size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    seeds, steps = [int(s) for s in sys.argv[5].split(",")], int(sys.argv[6])
    for seed in seeds:
        print(json.dumps([seed, run_seed(kind, backend, config, page_size, seed, steps)]),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
