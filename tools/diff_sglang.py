"""Differential check: kvstate.sglang vs the real SGLang 0.5.23 on the same call sequences.

    python tools/diff_sglang.py --seeds 50 --steps 200          # needs the peer venv
    PEERS=~/kvstate-peers python tools/diff_sglang.py --page-size 4

A seeded generator writes one call sequence.  Bare calls: alloc, free,
insert of fresh slots (the duplicate part freed), match + lock, unlock,
evict.  Request flows in 0.5.23's scheduler order: admit (match with
``limit = len - 1``, lock, row, evict the shortfall, ``alloc`` /
``alloc_extend``, row writes), a batched decode step (``alloc`` /
``alloc_decode`` and one ``write((rows, positions), slots)``), checkpoint,
finish (``checkpoint``, ``free_kv_row``, ``unlock``, free the row), retract
(no checkpoint), and a bare insert over a running request's prompt.  Both
sides use 0.5.23's call forms; the kvstate side alternates with the plain
seed-000 forms on every other call.

Each side runs it in its own interpreter (SGLang in the peer venv built by
../shared/peers/setup_peers.sh) and reports, after every call, the call's
result, the allocator's whole free list in order, evictable / protected /
total sizes and every running row's ``req_to_token`` entries.  The driver
compares the two traces and prints the first divergence.  Not a CI dependency.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from array import array
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PEERS_DIR = Path(os.environ.get("PEERS_HARNESS", HERE.parent.parent / "shared" / "peers"))
KINDS = ["alloc", "free", "insert", "insert", "match", "unlock", "evict", "admit", "admit",
         "decode", "decode", "decode", "checkpoint", "finish", "finish", "retract", "insert_running"]


def generate(seed: int, steps: int, page_size: int, vocab: int = 3) -> list[list[Any]]:
    rng = random.Random(seed)
    ops: list[list[Any]] = []

    def tokens(low: int, high: int) -> list[int]:
        return [rng.randint(1, vocab) for _ in range(rng.randint(low, high))]

    for _ in range(steps):
        kind = rng.choice(KINDS)
        if kind == "alloc":
            ops.append([kind, rng.randint(1, 3) * page_size])
        elif kind == "insert":
            ops.append([kind, tokens(page_size, 4 * page_size)])
        elif kind == "match":
            ops.append([kind, tokens(page_size, 5 * page_size)])
        elif kind == "evict":
            ops.append([kind, rng.randint(1, 3 * page_size)])
        elif kind == "admit":
            ops.append([kind, [tokens(2, 4 * page_size + 1), rng.randint(1, vocab)]])
        elif kind == "decode":
            ops.append([kind, [rng.randint(1, vocab) for _ in range(8)]])
        else:
            ops.append([kind, rng.random()])
    return ops


class Side:
    """The same interpretation of the op list on either implementation."""

    def __init__(self, size: int, page_size: int, sglang: bool) -> None:
        import torch

        self.torch = torch
        self.sglang = sglang
        self.page_size = page_size
        self.width = 8 * page_size + 64
        if sglang:
            sys.path.insert(0, str(PEERS_DIR))
            import peer_stubs

            peer_stubs.install()
            from sglang.srt.mem_cache import base_prefix_cache as api
            from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
            from sglang.srt.mem_cache.cache_init_params import CacheInitParams
            from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
            from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
        else:
            from kvstate.sglang import (
                CacheInitParams,
                PagedTokenToKVPoolAllocator,
                RadixCache,
                RadixKey,
                ReqToTokenPool,
                TokenToKVPoolAllocator,
            )
            from kvstate.sglang import params as api
        self.api, self.RadixKey = api, RadixKey
        self.pool = ReqToTokenPool(4, self.width, "cpu", False)
        if page_size == 1:
            self.alloc = TokenToKVPoolAllocator(size, torch.float16, "cpu", None, False)
        else:
            self.alloc = PagedTokenToKVPoolAllocator(size, page_size, torch.float16, "cpu", None, False)
        self.cache = RadixCache(CacheInitParams(disable=False, req_to_token_pool=self.pool,
                                                token_to_kv_pool_allocator=self.alloc,
                                                page_size=page_size))
        self.held: list[list[int]] = []  # slot groups the driver owns
        self.locks: list[Any] = []
        self.running: list[Any] = []
        self.calls = 0

    # -- calls: 0.5.23's forms, and on kvstate every other call the plain form ------------
    def _plain(self) -> bool:
        self.calls += 1
        return not self.sglang and self.calls % 2 == 0

    def _match(self, key: list[int], limit: int | None = None) -> tuple[int, Any]:
        if self._plain() and limit is None:
            slots, node = self.cache.match_prefix(key)
            return len(slots), node
        res = self.cache.match_prefix(self.api.MatchPrefixParams(
            key=self.RadixKey(array("q", key), None, limit=limit)))
        return int(res.device_prefix_len), res.last_device_node

    def _insert(self, key: list[int], value: Any) -> int:
        if self._plain():
            return int(self.cache.insert(key, value))
        params = self.api.InsertParams(key=self.RadixKey(array("q", key), None), value=value)
        return int(self.cache.insert(params).prefix_len)

    def _evict(self, n: int) -> int:
        if self._plain():
            return int(self.cache.evict(n))
        return int(self.cache.evict(self.api.EvictParams(num_tokens=n)).num_tokens_evicted)

    def _evict_for(self, n: int) -> None:
        """0.5.23's evict_from_tree_cache: evict the allocator's shortfall."""
        shortfall = n - self.alloc.available_size()
        if shortfall > 0:
            self._evict(shortfall)

    def _free_list(self) -> list[int]:
        if self.sglang:
            return [int(p) for p in self.alloc.free_pages.tolist()]
        return list(self.cache.state.free_pages)

    def _kv(self, req: Any) -> Any:
        return req.kv if self.sglang else req  # 0.5.23 keeps the row fields on ReqKvInfo

    # -- request flows --------------------------------------------------------------------
    def _new_req(self, prompt: list[int]) -> Any:
        if self.sglang:
            from peer_sglang import SReq

            return SReq(len(self.running), prompt)
        from kvstate.sglang import Req

        return Req(len(self.running), prompt)

    def _admit(self, prompt: list[int], first: int) -> Any:
        torch, pool, ps = self.torch, self.pool, self.page_size
        req = self._new_req(prompt)
        hit, req.last_node = self._match(prompt, limit=len(prompt) - 1)
        req.lock = self.cache.lock(req.last_node)
        rows = pool.alloc_rows(1)
        if rows is None:
            self.cache.unlock(req.lock)
            return "no row"
        kv = self._kv(req)
        kv.req_pool_idx, kv.cache_protected_len = rows[0], hit
        prefix = self.cache.path_device_indices(req.last_node)[:hit]
        extend = len(prompt) - hit
        if ps == 1:
            self._evict_for(extend)
            out = self.alloc.alloc(extend)
        else:
            self._evict_for(extend + ps)
            lens = [torch.tensor([hit]), torch.tensor([len(prompt)])]
            last = torch.tensor([int(prefix[-1]) if hit else -1])
            out = self.alloc.alloc_extend(lens[0], lens[0], lens[1], lens[1], last, extend)
        if out is None:
            self.cache.unlock(req.lock)
            pool.free_rows(rows)
            return "oom"
        pool.write((rows[0], slice(0, hit)), prefix)
        pool.write((rows[0], slice(hit, len(prompt))), out)
        req.output_ids.append(first)
        kv.kv_allocated_len = len(prompt)
        self.running.append(req)
        return [rows[0], hit, [int(v) for v in out.tolist()]]

    def _decode(self, tokens: list[int]) -> Any:
        torch, ps = self.torch, self.page_size
        batch = [r for r in self.running if self._kv(r).kv_allocated_len < self.width]
        if not batch:
            return "skip"
        rows = torch.tensor([self._kv(r).req_pool_idx for r in batch])
        seq = torch.tensor([self._kv(r).kv_allocated_len for r in batch])
        if ps == 1:
            self._evict_for(len(batch))
            out = self.alloc.alloc(len(batch))
        else:
            last = self.pool.req_to_token[rows, seq - 1]
            self._evict_for(len(batch) * ps)
            out = self.alloc.alloc_decode(seq + 1, seq + 1, last)
        if out is None:
            return "oom"
        self.pool.write((rows, seq), out.to(torch.int32))
        for index, req in enumerate(batch):
            self._kv(req).kv_allocated_len += 1
            req.output_ids.append(tokens[index % len(tokens)])
        return [int(v) for v in out.tolist()]

    def _checkpoint(self, req: Any, up_to: int) -> None:
        if self.sglang:
            req.full_untruncated_fill_ids = req.origin_input_ids + req.output_ids
        self.cache.checkpoint(req, up_to=up_to)

    def _release(self, req: Any, checkpoint: bool) -> Any:
        kv = self._kv(req)
        owned = kv.kv_allocated_len
        if checkpoint:
            self._checkpoint(req, owned)
        self.cache.free_kv_row(kv, [(kv.cache_protected_len, owned)])
        self.cache.unlock(req.lock)
        self.pool.free_rows([kv.req_pool_idx])
        kv.req_pool_idx = None
        self.running.remove(req)
        return kv.cache_protected_len

    def _insert_running(self, req: Any) -> Any:
        """A bare insert over a running request's prompt, with fresh slots."""
        key = [int(t) for t in req.origin_input_ids][: self._kv(req).kv_allocated_len]
        key = key[: len(key) // self.page_size * self.page_size]
        value = self.alloc.alloc(len(key)) if key else None
        if value is None:
            return None
        prefix = self._insert(key, value)
        if prefix:
            self.alloc.free(value[:prefix])
        return prefix

    # -- one op -----------------------------------------------------------------------------
    def run(self, op: list[Any]) -> Any:
        kind, arg = op
        if kind in ("checkpoint", "finish", "retract", "insert_running"):
            if not self.running:
                return "skip"
            req = self.running[int(arg * len(self.running))]
            if kind == "checkpoint":
                self._checkpoint(req, self._kv(req).kv_allocated_len)
                return self._kv(req).cache_protected_len
            if kind == "insert_running":
                return self._insert_running(req)
            return self._release(req, checkpoint=kind == "finish")
        if kind == "admit":
            return self._admit(*arg)
        if kind == "decode":
            return self._decode(arg)
        if kind == "alloc":
            out = self.alloc.alloc(arg)
            if out is None:
                return None
            self.held.append([int(v) for v in out.tolist()])
            return self.held[-1]
        if kind == "free":
            if not self.held:
                return "skip"
            group = self.held.pop(int(arg * len(self.held)))
            self.alloc.free(self.torch.tensor(group, dtype=self.torch.int64))
            return group
        if kind == "insert":
            value = self.alloc.alloc(len(arg) // self.page_size * self.page_size)
            if value is None or not len(value):
                return None
            prefix = self._insert(arg, value)
            if prefix:  # the caller's copies of the present prefix are duplicates
                self.alloc.free(value[:prefix])
            return prefix
        if kind == "match":
            hit, node = self._match(arg)
            self.locks.append(node)
            return [hit, int(self.cache.inc_lock_ref(node).delta)]
        if kind == "unlock":
            if not self.locks:
                return "skip"
            node = self.locks.pop(int(arg * len(self.locks)))
            return int(self.cache.dec_lock_ref(node).delta)
        if kind == "evict":
            return self._evict(arg)
        raise ValueError(kind)

    def trace(self, ops: list[list[Any]]) -> list[Any]:
        out = []
        for op in ops:
            result = self.run(op)
            rows = [[self._kv(r).req_pool_idx, self.pool.req_to_token[
                self._kv(r).req_pool_idx, : self._kv(r).kv_allocated_len].tolist()]
                for r in self.running]
            out.append([result, self._free_list(), self.cache.evictable_size(),
                        self.cache.protected_size(), self.cache.total_size(), rows])
        return out


def side_main(args: argparse.Namespace) -> int:
    """Run every seed's ops (a JSON list of op lists) on one side; print the traces."""
    runs = json.loads(Path(args.ops).read_text())
    size = args.size or max(32, 16 * args.page_size)
    traces = [Side(size, args.page_size, sglang=args.side == "sglang").trace(ops) for ops in runs]
    print(json.dumps(traces))
    return 0


def driver(args: argparse.Namespace) -> int:
    peers = Path(os.environ.get("PEERS", Path.home() / "kvstate-peers"))
    sglang_python = peers / "venv-sglang" / "bin" / "python"
    if not sglang_python.exists():
        print(f"no SGLang venv at {sglang_python}; run ../shared/peers/setup_peers.sh", file=sys.stderr)
        return 2
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    runs = [generate(seed, args.steps, args.page_size) for seed in seeds]
    ops_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"diff-sglang-{os.getpid()}.json"
    ops_file.write_text(json.dumps(runs))
    common = [__file__, "--ops", str(ops_file), "--size", str(args.size),
              "--page-size", str(args.page_size)]
    try:
        theirs = json.loads(subprocess.run(
            [str(sglang_python), *common, "--side", "sglang"], check=True, capture_output=True,
            text=True, cwd=str(PEERS_DIR)).stdout.splitlines()[-1])
        ours = json.loads(subprocess.run(
            [sys.executable, *common, "--side", "kvstate"], check=True, capture_output=True,
            text=True).stdout.splitlines()[-1])
    finally:
        ops_file.unlink()
    failures = 0
    for seed, ops, a_trace, b_trace in zip(seeds, runs, theirs, ours, strict=True):
        for index, (op, a, b) in enumerate(zip(ops, a_trace, b_trace, strict=True)):
            if a != b:
                failures += 1
                print(f"seed {seed} step {index} {op}: sglang={a} kvstate={b}")
                break
    calls = {kind: sum(op[0] == kind for ops in runs for op in ops) for kind in sorted(set(KINDS))}
    print(json.dumps({"seeds": args.seeds, "steps": args.steps, "page_size": args.page_size,
                      "size": args.size or max(32, 16 * args.page_size),
                      "divergent_seeds": failures, "calls": calls}))
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--side", choices=["sglang", "kvstate"])
    parser.add_argument("--ops")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--size", type=int, default=0, help="slots (default: max(32, 16 pages))")
    parser.add_argument("--page-size", type=int, default=1)
    args = parser.parse_args(argv)
    return side_main(args) if args.side else driver(args)


if __name__ == "__main__":
    sys.exit(main())
