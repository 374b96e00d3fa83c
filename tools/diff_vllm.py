"""Differential check: kvstate.vllm versus real vLLM 0.33 on the same random call sequences.

Not a CI dependency.  Run with kvstate's interpreter and point ``--peer-python``
at a Python that has vLLM 0.33 installed (see ../shared/peers/setup_peers.sh)::

    python tools/diff_vllm.py --peer-python $PEERS/venv-vllm/bin/python --seeds 50

For each seed it generates a scheduler-like call sequence (admit with
``get_computed_blocks`` + ``allocate_slots`` + ``record_prefix_cache_stats``,
decode steps, frees, preemptions (free, reset ``num_computed_tokens``, count
the preemption, re-admit), occasional ``evict_blocks`` /
``reset_prefix_cache`` / ``make_prefix_cache_stats``, pool-level
``get_new_blocks`` / ``touch`` / ``free_blocks``), runs it on kvstate in this
process and on vLLM in the peer process (this file again, with
``--vllm-side``), and compares after every call: returned block ids, hit
lengths, prefix-cache statistics, the free queue (head first), every block's
``ref_cnt`` and the KV events (class, hashes, parent, tokens, extra keys).
vLLM runs on CPU with ``PYTHONHASHSEED`` set and ``sha256_cbor``.  Prints
the first difference per seed and a summary; exit status 1 on any.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from typing import Any

Op = list[Any]


# -- workload ---------------------------------------------------------------------------
def make_ops(seed: int, num_ops: int, vocab: int, block_size: int) -> list[Op]:
    """A call sequence; prompts share prefixes (few distinct first tokens)."""
    rng = random.Random(seed)
    ops: list[Op] = []
    live: list[str] = []
    pool_held: list[int] = []  # unused on this side; the op just names how many
    next_id = 0
    stems = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 4) * block_size)]
             for _ in range(3)]
    for _ in range(num_ops):
        roll = rng.random()
        if roll < 0.33 or not live:
            stem = rng.choice(stems) if rng.random() < 0.7 else []
            tail = [rng.randrange(vocab) for _ in range(rng.randrange(1, 3 * block_size))]
            salt = "s1" if rng.random() < 0.1 else None
            rid = f"r{next_id}"
            next_id += 1
            ops.append(["admit", rid, stem + tail, salt, rng.choice([0, 0, 1, 2])])
            live.append(rid)
        elif roll < 0.66:
            ops.append(["decode", rng.choice(live), rng.randrange(vocab)])
        elif roll < 0.80:
            rid = live.pop(rng.randrange(len(live)))
            ops.append(["free", rid])
        elif roll < 0.86:
            ops.append(["preempt", rng.choice(live)])
        elif roll < 0.89:
            ops.append(["evict", sorted(rng.sample(range(1, 6), 2))])
        elif roll < 0.91:
            ops.append(["reset"])
        elif roll < 0.94:
            ops.append(["stats"])
        elif roll < 0.98:
            ops.append(["pool_get", rng.randrange(0, 3)])
        else:
            ops.append(["pool_release"])
    del pool_held
    return ops


# -- observation helpers (shared by both sides; plain Python objects only) ----------------
def event_view(event: Any) -> list[Any]:
    name = type(event).__name__
    if name == "BlockStored":
        extra = None if event.extra_keys is None else [
            None if k is None else list(k) for k in event.extra_keys]
        return [name, list(event.block_hashes), event.parent_block_hash, list(event.token_ids),
                event.block_size, event.lora_name, extra, event.group_idx,
                event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window]
    if name == "BlockRemoved":
        return [name, list(event.block_hashes), event.medium, event.group_idx]
    return [name]


def admit(manager: Any, req: Any, lookahead: int = 0) -> list[Any]:
    """The scheduler's admission: look up, allocate, count the lookup once admitted."""
    blocks, hit, _boundary = manager.get_computed_blocks(req)
    new = manager.allocate_slots(req, req.num_tokens - hit, hit, blocks,
                                 num_lookahead_tokens=lookahead)
    if new is not None:
        manager.record_prefix_cache_stats(req, hit)
        req.num_computed_tokens = req.num_tokens
    return [blocks.get_block_ids()[0], hit, None if new is None else new.get_block_ids()[0]]


def stats_view(stats: Any) -> list[Any]:
    return [stats.reset, stats.requests, stats.queries, stats.hits, stats.preempted_requests,
            stats.preempted_queries, stats.preempted_hits]


def run_ops(ops: list[Op], api: dict[str, Any]) -> list[Any]:
    """Drive one implementation through ``api`` callables; return the observation trace."""
    manager = api["manager"]
    pool = manager.block_pool
    make_request = api["request"]
    requests: dict[str, Any] = {}
    pool_blocks: list[Any] = []
    trace: list[Any] = []
    for op in ops:
        kind = op[0]
        result: Any = None
        if kind == "admit":
            _, rid, tokens, salt, lookahead = op
            req = make_request(rid, tokens, salt)
            result = admit(manager, req, lookahead)
            if result[2] is not None:
                requests[rid] = req
                req.append_output_token_ids(tokens[0])
        elif kind == "preempt":  # vLLM's _preempt_request, then the request is resumed at once
            req = requests.get(op[1])
            if req is not None:
                manager.free(req)
                req.num_computed_tokens = 0
                req.num_preemptions += 1
                result = admit(manager, req)
                if result[2] is None:
                    del requests[op[1]]
        elif kind == "stats":
            result = stats_view(manager.make_prefix_cache_stats())
        elif kind == "decode":
            req = requests.get(op[1])
            if req is not None:
                new = manager.allocate_slots(req, 1)
                result = None if new is None else new.get_block_ids()[0]
                if new is not None:
                    req.num_computed_tokens += 1
                    req.append_output_token_ids(op[2])
        elif kind == "free":
            req = requests.pop(op[1], None)
            if req is not None:
                manager.free(req)
        elif kind == "evict":
            manager.evict_blocks(set(op[1]))
        elif kind == "reset":
            result = manager.reset_prefix_cache()
        elif kind == "pool_get":
            count = min(op[1], pool.get_num_free_blocks())
            got = pool.get_new_blocks(count)
            pool_blocks.extend(got)
            if got and len(pool_blocks) % 2 == 0:
                pool.touch(got[:1])
                pool_blocks.append(got[0])
            result = [b.block_id for b in got]
        elif kind == "pool_release":
            # Extra references go in a second call: kvstate rejects a duplicate
            # inside one free_blocks (a documented deviation).
            first: list[Any] = []
            again: list[Any] = []
            seen: set[int] = set()
            for block in pool_blocks:
                (again if block.block_id in seen else first).append(block)
                seen.add(block.block_id)
            pool.free_blocks(first)
            pool.free_blocks(again)
            pool_blocks.clear()
        state = [op, result, api["free_queue"](pool),
                 [pool.blocks[i].ref_cnt for i in range(1, pool.num_gpu_blocks)],
                 {rid: manager.get_block_ids(rid)[0] for rid in sorted(requests)},
                 [event_view(e) for e in manager.take_events()]]
        trace.append(state)
    return trace


# -- vLLM side (peer interpreter) --------------------------------------------------------
def vllm_side(config: dict[str, Any], ops: list[Op]) -> list[Any]:
    os.environ["PYTHONHASHSEED"] = str(config["seed"])
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        SlidingWindowSpec,
    )
    from vllm.v1.request import Request

    init_none_hash(sha256_cbor)
    block_size = config["block_size"]
    if config["sliding_window"]:
        spec: Any = SlidingWindowSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                      dtype=torch.float32, sliding_window=config["sliding_window"])
    else:
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                 dtype=torch.float32)
    kv_config = KVCacheConfig(num_blocks=config["num_blocks"], kv_cache_tensors=[],
                              kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    manager = KVCacheManager(kv_config, max_model_len=config["max_model_len"],
                             scheduler_block_size=block_size, hash_block_size=block_size,
                             enable_caching=config["enable_caching"],
                             enable_kv_cache_events=True, log_stats=True)
    hasher = get_request_block_hasher(block_size, sha256_cbor)
    params = SamplingParams(max_tokens=1 << 20)

    def make_request(rid: str, tokens: list[int], salt: str | None) -> Any:
        return Request(rid, list(tokens), params, None, cache_salt=salt, block_hasher=hasher)

    def free_queue(pool: Any) -> list[int]:
        return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]

    return run_ops(ops, {"manager": manager, "request": make_request, "free_queue": free_queue})


# -- kvstate side --------------------------------------------------------------------------
def kvstate_side(config: dict[str, Any], ops: list[Op]) -> tuple[list[Any], list[str]]:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from kvstate.invariants import check
    from kvstate.vllm.manager import KVCacheManager
    from kvstate.vllm.request import Request

    seed = str(config["seed"])
    manager = KVCacheManager(config["num_blocks"], config["block_size"], config["max_model_len"],
                             enable_caching=config["enable_caching"],
                             sliding_window=config["sliding_window"] or None,
                             enable_kv_cache_events=True, hash_seed=seed, keep_events=False,
                             log_stats=True)
    violations: list[str] = []

    def watch(_event: Any, view: Any) -> None:
        if not violations:
            violations.extend(str(v) for v in check(view))

    manager.engine.subscribe(watch)

    def make_request(rid: str, tokens: list[int], salt: str | None) -> Any:
        return Request(rid, tokens, config["block_size"], hash_seed=seed, cache_salt=salt)

    def free_queue(pool: Any) -> list[int]:
        return pool.free_block_ids()

    trace = run_ops(ops, {"manager": manager, "request": make_request, "free_queue": free_queue})
    return trace, violations


def _normalise(value: Any) -> Any:
    return json.loads(json.dumps(value))


def compare(ours: list[Any], theirs: list[Any]) -> str | None:
    labels = ["op", "result", "free queue", "ref_cnt", "block tables", "events"]
    for index, (mine, other) in enumerate(zip(ours, theirs, strict=False)):
        for label, a, b in zip(labels, mine, other, strict=True):
            if a != b:
                return f"call {index} {mine[0]}: {label} differs\n  kvstate: {a}\n  vllm:    {b}"
    if len(ours) != len(theirs):
        return f"trace lengths differ: {len(ours)} vs {len(theirs)}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-python", help="interpreter with vLLM 0.33 installed")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--ops", type=int, default=120)
    parser.add_argument("--vllm-side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.vllm_side:
        payload = json.load(sys.stdin)
        out = [vllm_side(job["config"], job["ops"]) for job in payload]
        json.dump(out, sys.stdout)
        return 0
    if not args.peer_python:
        parser.error("--peer-python is required")
    jobs: list[dict[str, Any]] = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        rng = random.Random(seed)
        config = {"seed": seed, "block_size": rng.choice([2, 4, 16]),
                  "num_blocks": rng.choice([6, 11, 24, 64]), "max_model_len": 4096,
                  "enable_caching": rng.random() < 0.85,
                  "sliding_window": rng.choice([0, 0, 0, 5, 9])}
        ops = make_ops(seed, args.ops, vocab=6, block_size=config["block_size"])
        jobs.append({"config": config, "ops": ops})
    env = dict(os.environ, PYTHONWARNINGS="ignore", VLLM_LOGGING_LEVEL="ERROR")
    proc = subprocess.run([args.peer_python, os.path.abspath(__file__), "--vllm-side"],
                          input=json.dumps(jobs), capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        print(proc.stderr[-4000:], file=sys.stderr)
        return 2
    theirs_all = json.loads(proc.stdout)
    failures = 0
    calls = events = hits = refused = preempted = stats = 0
    for job, theirs in zip(jobs, theirs_all, strict=True):
        ours, violations = kvstate_side(job["config"], job["ops"])
        calls += len(ours)
        for step in theirs:
            events += len(step[5])
            if step[0][0] in ("admit", "preempt") and step[1] is not None:
                hits += step[1][1] > 0
                refused += step[1][2] is None
                preempted += step[0][0] == "preempt"
            stats += step[0][0] == "stats"
        problem = compare(_normalise(ours), theirs)
        if violations:
            problem = (problem or "") + f"\n  invariant violated: {violations[0]}"
        if problem:
            failures += 1
            print(f"seed {job['config']['seed']} {job['config']}: {problem}")
    print(f"{len(jobs)} sequences, {calls} calls compared ({events} KV events, {hits} admissions "
          f"with prefix hits, {refused} refused for lack of blocks, {preempted} preemptions, "
          f"{stats} statistics snapshots), {failures} with differences")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
