"""Benchmark: kvstate.vllm against vLLM 0.33's own BlockPool / KVCacheManager, same workload.

    python tools/bench_vllm.py --peer-python $PEERS/venv-vllm/bin/python [--out docs/benchmarks-vllm.md]

Both sides run this file's ``workloads`` (vLLM in a subprocess of the peer
interpreter, CPU only), with KV-cache events enabled; kvstate also runs with a
log ``Recorder`` attached (the event log recording on).  Reported:

* allocate + free: ``get_new_blocks(k)`` then ``free_blocks`` (ns per block);
* touch: ``touch`` of k cached free blocks (ns per block; the untimed free puts them back);
* cache: ``cache_full_blocks`` of k fresh blocks (ns per block; untimed evict/free after);
* hashing: building a request of 50k tokens, block size 16 (ns per token);
* manager: a scheduler-like loop (admit with prefix hits, decode, free) (us per call);
* hybrid managers: the same loop for a full-attention group next to a sliding-window group,
  a Mamba "align" group, or both (``KVCacheConfig`` with the engine's retention 0; admission
  with ``full_sequence_must_fit``; a Mamba prompt prefills in two chunks, up to its last
  aligned block and the rest, as vLLM's scheduler splits it when there is no junction).

Each figure is the best (minimum) of ``--rounds`` x ``--repeat`` runs, timed in CPU time of
the process (``time.process_time_ns``; ``--clock wall`` for ``time.perf_counter_ns``): the
machine these run on is shared, CPU time leaves out the time other jobs hold the cores, and
the minimum is the least disturbed run.  Rounds alternate the implementations, so both see
the same load on average; compare ratios, not ns.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

NUM_BLOCKS = 100_000
BLOCK_SIZE = 16
CLOCKS = {"cpu": time.process_time_ns, "wall": time.perf_counter_ns}
_clock = CLOCKS["cpu"]


def _median_ns(run: Callable[[], int], repeat: int) -> float:
    """Best of ``repeat`` runs (see the module docstring for why not the median)."""
    return float(min(run() for _ in range(repeat)))


def workloads(api: dict[str, Any], repeat: int, hybrid_only: bool = False) -> dict[str, float]:
    """Run every workload through ``api`` (pool/manager/request factories); ns figures."""
    out: dict[str, float] = {}
    if hybrid_only:
        return hybrid_workloads(api, repeat, out)
    clock = _clock
    pool = api["pool"](NUM_BLOCKS)
    for count in (16, 128, 1024):
        def alloc_free(count: int = count) -> int:
            start = clock()
            blocks = pool.get_new_blocks(count)
            pool.free_blocks(blocks)
            return clock() - start
        out[f"alloc+free x{count} (ns/block)"] = _median_ns(alloc_free, repeat) / count

    count = 1024
    request = api["request"]("bench", list(range(count * BLOCK_SIZE)))

    def cache() -> int:
        blocks = pool.get_new_blocks(count)
        start = clock()
        pool.cache_full_blocks(request, blocks, 0, count, BLOCK_SIZE, 0)
        elapsed = clock() - start
        pool.evict_blocks({b.block_id for b in blocks})
        pool.free_blocks(blocks)
        pool.take_events()
        return elapsed
    out[f"cache_full_blocks x{count} (ns/block)"] = _median_ns(cache, repeat) / count

    cached = pool.get_new_blocks(count)
    pool.cache_full_blocks(request, cached, 0, count, BLOCK_SIZE, 0)
    pool.free_blocks(list(reversed(cached)))

    def touch() -> int:
        start = clock()
        pool.touch(cached)
        elapsed = clock() - start
        pool.free_blocks(list(reversed(cached)))
        return elapsed
    out[f"touch x{count} cached free (ns/block)"] = _median_ns(touch, repeat) / count
    pool.take_events()

    tokens = list(range(50_000))

    def hashing() -> int:
        start = clock()
        api["request"]("h", tokens)
        return clock() - start
    out["hash 50k tokens, bs 16 (ns/token)"] = _median_ns(hashing, repeat) / len(tokens)

    def scheduler_loop() -> int:
        manager = api["manager"](2048)
        calls = 0
        start = clock()
        live: list[Any] = []
        for index in range(200):
            stem = [index % 7] * 64
            req = api["request"](f"r{index}", stem + list(range(index, index + 40)))
            blocks, hit, _ = manager.get_computed_blocks(req)
            if manager.allocate_slots(req, req.num_tokens - hit, hit, blocks) is not None:
                req.num_computed_tokens = req.num_tokens
                live.append(req)
            calls += 2
            for running in live:
                running.append_output_token_ids(index)
                manager.allocate_slots(running, 1)
                running.num_computed_tokens += 1
                calls += 1
            if len(live) > 16:
                manager.free(live.pop(0))
                calls += 1
            manager.take_events()
        return (clock() - start) // calls
    out["manager loop (ns/call)"] = _median_ns(scheduler_loop, max(3, repeat // 5))
    return hybrid_workloads(api, repeat, out)


def hybrid_workloads(api: dict[str, Any], repeat: int, out: dict[str, float]) -> dict[str, float]:
    for kind in HYBRID_KINDS:
        out[f"hybrid {kind} loop (ns/call)"] = _median_ns(
            lambda kind=kind: hybrid_loop(api, kind), max(3, repeat // 5))
    return out


HYBRID_KINDS = ("full+swa", "full+mamba", "full+swa+mamba")


def hybrid_loop(api: dict[str, Any], kind: str) -> int:
    """The manager loop on a hybrid model; ns per manager call."""
    clock = _clock
    manager = api["hybrid"](4096, kind)
    mamba = "mamba" in kind
    calls = 0
    live: list[Any] = []
    start = clock()
    for index in range(200):
        manager.new_step_starts()
        req = api["request"](f"r{index}", [index % 7] * 64 + list(range(index, index + 40)))
        blocks, hit, junction = manager.get_computed_blocks(req)
        req.shared_prefix_boundary = junction
        first = req.num_tokens - hit
        if mamba and (req.num_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE > hit:
            first = (req.num_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE - hit
        new = manager.allocate_slots(req, first, hit, blocks, full_sequence_must_fit=True)
        calls += 2
        if new is not None:
            req.num_computed_tokens = hit + first
            rest = req.num_tokens - req.num_computed_tokens
            if rest:
                manager.new_step_starts()
                manager.allocate_slots(req, rest)
                req.num_computed_tokens += rest
                calls += 1
            live.append(req)
        for running in live:
            running.append_output_token_ids(index)
            manager.allocate_slots(running, 1)
            running.num_computed_tokens += 1
            calls += 1
        if len(live) > 16:
            manager.free(live.pop(0))
            calls += 1
        manager.take_events()
    return (clock() - start) // calls


def hybrid_config(interface: Any, kind: str, num_blocks: int, dtype: Any) -> Any:
    """``KVCacheConfig`` for ``kind`` with either side's classes (window 128, retention 0)."""
    specs = [interface.FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8,
                                         dtype=dtype)]
    if "swa" in kind:
        specs.append(interface.SlidingWindowSpec(block_size=BLOCK_SIZE, num_kv_heads=1,
                                                 head_size=8, dtype=dtype, sliding_window=128))
    if "mamba" in kind:
        specs.append(interface.MambaSpec(block_size=BLOCK_SIZE, shapes=((2, 8),),
                                         dtypes=(dtype,), mamba_cache_mode="align"))
    groups = [interface.KVCacheGroupSpec([f"layer{i}"], spec) for i, spec in enumerate(specs)]
    return interface.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                                   kv_cache_groups=groups, prefix_cache_retention_interval=0)


# -- vLLM side ---------------------------------------------------------------------------------
def vllm_api() -> dict[str, Any]:
    os.environ.setdefault("PYTHONHASHSEED", "0")
    import torch
    import vllm.v1.kv_cache_interface as interface
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    init_none_hash(sha256_cbor)
    hasher = get_request_block_hasher(BLOCK_SIZE, sha256_cbor)
    params = SamplingParams(max_tokens=1 << 20)

    def manager(num_blocks: int) -> Any:
        spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1,
                                 dtype=torch.float32)
        config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                               kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
        return KVCacheManager(config, max_model_len=1 << 16, scheduler_block_size=BLOCK_SIZE,
                              hash_block_size=BLOCK_SIZE, enable_caching=True,
                              enable_kv_cache_events=True)

    def hybrid(num_blocks: int, kind: str) -> Any:
        return KVCacheManager(hybrid_config(interface, kind, num_blocks, torch.float32),
                              max_model_len=1 << 16, scheduler_block_size=BLOCK_SIZE,
                              hash_block_size=BLOCK_SIZE, enable_kv_cache_events=True)

    return {
        "pool": lambda n: BlockPool(n, True, BLOCK_SIZE, enable_kv_cache_events=True),
        "request": lambda rid, tokens: Request(rid, tokens, params, None, block_hasher=hasher),
        "manager": manager,
        "hybrid": hybrid,
    }


# -- kvstate side ------------------------------------------------------------------------------
def kvstate_api(record_dir: str | None, root: str | None = None) -> dict[str, Any]:
    """kvstate's factories; ``root``: the source tree to import kvstate from (default: this
    checkout), so ``--baseline-root`` can time an earlier tree in the same run."""
    sys.path.insert(0, root or os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import kvstate.vllm.kv_cache_interface as interface
    from kvstate.log import Recorder
    from kvstate.vllm.block_pool import BlockPool
    from kvstate.vllm.manager import KVCacheManager
    from kvstate.vllm.request import Request

    recorders: list[Any] = []

    def attach(target: Any) -> Any:
        if record_dir is not None:
            path = os.path.join(record_dir, f"run{len(recorders)}.kvlog")
            recorders.append(Recorder(target, path, fsync=False))
        return target

    return {
        "pool": lambda n: attach(BlockPool(n, True, BLOCK_SIZE, enable_kv_cache_events=True,
                                           hash_seed="0", keep_events=False)),
        "request": lambda rid, tokens: Request(rid, tokens, BLOCK_SIZE, hash_seed="0"),
        "manager": lambda n: attach(KVCacheManager(n, BLOCK_SIZE, 1 << 16,
                                                   enable_kv_cache_events=True, hash_seed="0",
                                                   keep_events=False)),
        "hybrid": lambda n, kind: attach(KVCacheManager(
            hybrid_config(interface, kind, n, "float32"), 1 << 16, BLOCK_SIZE, BLOCK_SIZE,
            enable_kv_cache_events=True, hash_seed="0", keep_events=False)),
        "_recorders": recorders,
    }


def kvstate_side(args: argparse.Namespace) -> dict[str, float]:
    """One kvstate run (this process): events on, with a log recorder when ``--record``."""
    if not args.record:
        return workloads(kvstate_api(None, args.root), args.repeat, args.hybrid_only)
    with tempfile.TemporaryDirectory() as workdir:
        api = kvstate_api(workdir, args.root)
        figures = workloads(api, args.repeat, args.hybrid_only)
        for recorder in api["_recorders"]:
            recorder.close()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-python", help="interpreter with vLLM 0.33 installed")
    parser.add_argument("--baseline-root",
                        help="an earlier kvstate source tree, timed in the same rounds")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="write a Markdown table here")
    parser.add_argument("--hybrid-only", action="store_true",
                        help="only the hybrid manager loops")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                        help="cpu: process CPU time (default); wall: elapsed time")
    parser.add_argument("--vllm-side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kvstate-side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--record", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global _clock
    _clock = CLOCKS[args.clock]
    if args.vllm_side:
        json.dump(workloads(vllm_api(), args.repeat, args.hybrid_only), sys.stdout)
        return 0
    if args.kvstate_side:
        json.dump(kvstate_side(args), sys.stdout)
        return 0
    common = ["--repeat", str(args.repeat), "--clock", args.clock,
              *(["--hybrid-only"] if args.hybrid_only else [])]
    here = os.path.abspath(__file__)
    sides: list[tuple[str, list[str]]] = []  # every side in its own process, one per round
    if args.peer_python:
        sides.append(("vLLM 0.33", [args.peer_python, here, "--vllm-side", *common]))
    if args.baseline_root:
        sides.append(("kvstate before (events on)",
                      [sys.executable, here, "--kvstate-side", "--root",
                       os.path.abspath(args.baseline_root), *common]))
    sides.append(("kvstate (events on)", [sys.executable, here, "--kvstate-side", *common]))
    sides.append(("kvstate (events + log recorder)",
                  [sys.executable, here, "--kvstate-side", "--record", *common]))
    results: dict[str, dict[str, float]] = {}
    env = dict(os.environ, PYTHONWARNINGS="ignore", VLLM_LOGGING_LEVEL="ERROR")
    for _ in range(args.rounds):  # interleaved, so every side sees the same machine load
        for name, command in sides:
            proc = subprocess.run(command, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                return 2
            best = results.setdefault(name, {})
            for key, value in json.loads(proc.stdout).items():
                best[key] = min(value, best.get(key, value))
    table = _table(results, args.peer_python is not None)
    print(table)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(f"<!-- generated by tools/bench_vllm.py on {platform.python_version()}, "
                         f"{platform.machine()}, clock {args.clock} -->\n{table}\n")
    return 0


def _table(results: dict[str, dict[str, float]], with_peer: bool) -> str:
    names = list(results)
    ratios = ["kvstate (events on)"] + [n for n in names if n.startswith("kvstate before")]
    columns = names + ([f"{name.split(' (')[0]} / vLLM" for name in ratios] if with_peer else [])
    rows = [f"| workload | {' | '.join(columns)} |", "|---|" + "---:|" * len(columns)]
    for key in results["kvstate (events on)"]:
        cells = [f"{results[name][key]:,.0f}" for name in names]
        if with_peer:
            peer = results["vLLM 0.33"][key]
            cells += [f"{results[name][key] / peer:.2f}x" for name in ratios]
        rows.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
