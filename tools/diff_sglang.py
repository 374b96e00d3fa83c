"""Differential check: kvstate.sglang vs the real SGLang 0.5.23 on the same call sequences.

    python tools/diff_sglang.py --seeds 50 --steps 200          # needs the peer venv
    PEERS=~/kvstate-peers python tools/diff_sglang.py --page-size 4

A seeded generator writes one call sequence (alloc, free, insert of fresh
slots with the duplicate part freed, match + lock, unlock, evict).  Each side
runs it in its own interpreter (SGLang in the peer venv built by
../shared/peers/setup_peers.sh) and reports, after every call, the call's
result, the allocator's whole free list in order, and evictable / protected /
total sizes.  The driver compares the two traces and prints the first
divergence.  Not a CI dependency.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PEERS_DIR = HERE.parent.parent / "shared" / "peers"


def generate(seed: int, steps: int, page_size: int, vocab: int = 3) -> list[list[Any]]:
    rng = random.Random(seed)
    ops: list[list[Any]] = []
    for _ in range(steps):
        kind = rng.choice(["alloc", "free", "insert", "insert", "match", "unlock", "evict"])
        if kind == "alloc":
            ops.append(["alloc", rng.randint(1, 3) * page_size])
        elif kind == "insert":
            ops.append(["insert", [rng.randint(1, vocab) for _ in range(rng.randint(1, 4) * page_size)]])
        elif kind == "match":
            ops.append(["match", [rng.randint(1, vocab) for _ in range(rng.randint(1, 5) * page_size)]])
        elif kind == "evict":
            ops.append(["evict", rng.randint(1, 3 * page_size)])
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
        if sglang:
            sys.path.insert(0, str(PEERS_DIR))
            import peer_stubs

            peer_stubs.install()
            from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
            from sglang.srt.mem_cache.cache_init_params import CacheInitParams
            from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
            from sglang.srt.mem_cache.radix_cache import RadixCache

            pool = ReqToTokenPool(size=4, max_context_len=64, device="cpu", enable_memory_saver=False)
            if page_size == 1:
                self.alloc = TokenToKVPoolAllocator(size, torch.float16, "cpu", None, need_sort=False)
            else:
                self.alloc = PagedTokenToKVPoolAllocator(size, page_size, torch.float16, "cpu", None,
                                                         need_sort=False)
            self.cache = RadixCache(CacheInitParams(disable=False, req_to_token_pool=pool,
                                                    token_to_kv_pool_allocator=self.alloc,
                                                    page_size=page_size))
        else:
            from kvstate.sglang import (
                PagedTokenToKVPoolAllocator,
                RadixCache,
                ReqToTokenPool,
                TokenToKVPoolAllocator,
            )

            pool = ReqToTokenPool(size=4, max_context_len=64)
            if page_size == 1:
                self.alloc = TokenToKVPoolAllocator(size)
            else:
                self.alloc = PagedTokenToKVPoolAllocator(size, page_size)
            self.cache = RadixCache(pool, self.alloc, page_size=page_size)
        self.held: list[list[int]] = []  # slot groups the driver owns
        self.locks: list[Any] = []

    # -- calls in the two dialects ------------------------------------------------
    def _match(self, key: list[int]) -> tuple[list[int], Any]:
        if self.sglang:
            from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
            from sglang.srt.mem_cache.radix_cache import RadixKey

            res = self.cache.match_prefix(MatchPrefixParams(key=RadixKey(key, None)))
            node = res.last_device_node
            slots = self.cache.path_device_indices(node)[: res.device_prefix_len]
            return [int(v) for v in slots.tolist()], node
        slots, node = self.cache.match_prefix(key)
        return [int(v) for v in slots.tolist()], node

    def _insert(self, key: list[int], value: Any) -> int:
        if self.sglang:
            from sglang.srt.mem_cache.base_prefix_cache import InsertParams
            from sglang.srt.mem_cache.radix_cache import RadixKey

            return int(self.cache.insert(InsertParams(key=RadixKey(key, None), value=value)).prefix_len)
        return int(self.cache.insert(key, value))

    def _evict(self, n: int) -> int:
        if self.sglang:
            from sglang.srt.mem_cache.base_prefix_cache import EvictParams

            return int(self.cache.evict(EvictParams(num_tokens=n)).num_tokens_evicted)
        return int(self.cache.evict(n))

    def _lock(self, node: Any, inc: bool) -> int:
        result = self.cache.inc_lock_ref(node) if inc else self.cache.dec_lock_ref(node)
        return int(result.delta) if self.sglang else int(result)

    def _free_list(self) -> list[int]:
        if self.sglang:
            return [int(p) for p in self.alloc.free_pages.tolist()]
        return list(self.cache.state.free_pages)

    def run(self, op: list[Any]) -> Any:
        torch = self.torch
        kind, arg = op
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
            self.alloc.free(torch.tensor(group, dtype=torch.int64))
            return group
        if kind == "insert":
            n = len(arg)
            value = self.alloc.alloc(n)
            if value is None:
                return None
            prefix = self._insert(arg, value)
            if prefix:  # the caller's copies of the present prefix are duplicates
                self.alloc.free(value[:prefix])
            return prefix
        if kind == "match":
            slots, node = self._match(arg)
            self.locks.append(node)
            return [slots, self._lock(node, True)]
        if kind == "unlock":
            if not self.locks:
                return "skip"
            node = self.locks.pop(int(arg * len(self.locks)))
            return self._lock(node, False)
        if kind == "evict":
            return self._evict(arg)
        raise ValueError(kind)

    def trace(self, ops: list[list[Any]]) -> list[Any]:
        out = []
        for op in ops:
            result = self.run(op)
            out.append([result, self._free_list(), self.cache.evictable_size(),
                        self.cache.protected_size(), self.cache.total_size()])
        return out


def side_main(args: argparse.Namespace) -> int:
    ops = json.loads(Path(args.ops).read_text())
    side = Side(args.size, args.page_size, sglang=args.side == "sglang")
    print(json.dumps(side.trace(ops)))
    return 0


def driver(args: argparse.Namespace) -> int:
    peers = Path(os.environ.get("PEERS", Path.home() / "kvstate-peers"))
    sglang_python = peers / "venv-sglang" / "bin" / "python"
    if not sglang_python.exists():
        print(f"no SGLang venv at {sglang_python}; run ../shared/peers/setup_peers.sh", file=sys.stderr)
        return 2
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    failures = 0
    for seed in range(args.seeds):
        ops = generate(seed, args.steps, args.page_size)
        ops_file = tmp / f"diff-sglang-{seed}.json"
        ops_file.write_text(json.dumps(ops))
        common = [__file__, "--ops", str(ops_file), "--size", str(args.size),
                  "--page-size", str(args.page_size)]
        theirs = json.loads(subprocess.run(
            [str(sglang_python), *common, "--side", "sglang"], check=True, capture_output=True,
            text=True, cwd=str(PEERS_DIR)).stdout.splitlines()[-1])
        ours = json.loads(subprocess.run(
            [sys.executable, *common, "--side", "kvstate"], check=True, capture_output=True,
            text=True).stdout.splitlines()[-1])
        for index, (op, a, b) in enumerate(zip(ops, theirs, ours, strict=True)):
            if a != b:
                failures += 1
                print(f"seed {seed} step {index} {op}: sglang={a} kvstate={b}")
                break
    print(json.dumps({"seeds": args.seeds, "steps": args.steps, "page_size": args.page_size,
                      "size": args.size, "divergent_seeds": failures}))
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--side", choices=["sglang", "kvstate"])
    parser.add_argument("--ops")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--page-size", type=int, default=1)
    args = parser.parse_args(argv)
    return side_main(args) if args.side else driver(args)


if __name__ == "__main__":
    sys.exit(main())
