"""Differential check: kvstate's hybrid KVCacheManager versus real vLLM 0.33, same call sequences.

Not a CI dependency.  Run with kvstate's interpreter, pointing ``--peer-python``
at a Python with vLLM 0.33 (see ../shared/peers/setup_peers.sh)::

    python tools/diff_vllm_hybrid.py --peer-python $PEERS/venv-vllm/bin/python \\
        --layouts swa mamba swa+mamba --block-sizes 1 16 --seeds 40 --ops 150

Directed scripts come first: the worked examples of ../shared/reference/hybrid.md
section 2 (requests A-D of ``vl_hybrid_demo.py``), a Mamba hit on a state
cached in the same step, and a prompt state re-cached after eviction, for
each layout under retention 0 and None.  Then each random seed builds one
``KVCacheConfig`` (a full-attention group plus sliding-window groups of one
or two windows, a Mamba "align" group, or both, in shuffled group order;
with ``--layouts full swa-only`` one group, through the config constructor;
retention 0, None or a positive interval; caching mostly on) and a
scheduler-like call sequence: new steps (``new_step_starts``), admissions
(``get_computed_blocks``, ``shared_prefix_boundary``, the Mamba chunk split:
kvstate's helper here, vLLM's own ``Scheduler._mamba_block_aligned_split`` there,
``allocate_slots`` with ``full_sequence_must_fit`` as vLLM's scheduler passes
it, statistics), prefill chunks under a token budget, decode steps with
lookahead slots, frees, preemptions, ``evict_blocks``, ``reset_prefix_cache``
and statistics snapshots.  The same sequence runs on kvstate (this process,
``kvstate.invariants.check`` after every batch, a log ``Recorder`` whose log
must replay to the same state) and on vLLM (a subprocess of the peer
interpreter: this file with ``--vllm-side``), compared after every call:
returned block ids per group, hits and junctions, the free queue (head
first), every block's ``ref_cnt``, every live request's per-group tables,
the KV events (all fields) and their map-form bytes (kvstate's encoder
against vLLM's msgspec encoder).  Prints the first difference per seed and a
summary; exit status 1 on any difference.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from types import SimpleNamespace
from typing import Any

Op = list[Any]
LAYOUTS = ("swa", "mamba", "swa+mamba", "full", "swa-only")
DEFAULT_LAYOUTS = ("swa", "mamba", "swa+mamba")
MAX_PREFILL_TOKENS = 8192  # the scheduler's max_num_scheduled_tokens


# -- configuration and workload ----------------------------------------------------------------
def make_config(seed: int, layout: str, block_size: int) -> dict[str, Any]:
    rng = random.Random(f"{seed}/{layout}/{block_size}")
    windows = [1 + block_size * rng.choice([1, 2]) + rng.choice([0, 1, block_size // 2]),
               2 + block_size * rng.choice([1, 3]) + rng.choice([0, 3])]
    groups: list[list[Any]] = [] if layout == "swa-only" else [["full"]]
    if "swa" in layout:
        groups += [["swa", windows[0]] for _ in range(rng.choice([1, 2]))]
        if rng.random() < 0.3 and layout != "swa-only":
            groups.append(["swa", windows[1]])
    if "mamba" in layout:
        groups.append(["mamba"])
    rng.shuffle(groups)  # vLLM looks full attention up first whatever its index
    per_request = len(groups) * (4 if block_size >= 8 else 24)
    return {"seed": seed, "layout": layout, "block_size": block_size, "groups": groups,
            "num_blocks": rng.choice([1, 2, 4]) * per_request + 1, "max_model_len": 4096,
            "max_in_flight_tokens": rng.choice([None, 256, 2 * max(block_size, 4), 1]),
            "retention": rng.choice([0, 0, 0, None, None, 4 * block_size])
            if layout != "full" else rng.choice([0, None]),
            "caching": rng.random() < 0.9}


def make_ops(seed: int, num_ops: int, block_size: int, num_blocks: int) -> list[Op]:
    """A call sequence; prompts share stems (few distinct tokens) so prefixes and junctions recur."""
    rng = random.Random(seed)
    unit = max(block_size, 4)
    stems = [[rng.randrange(5) for _ in range(rng.randrange(1, 4) * unit)] for _ in range(3)]
    ops: list[Op] = []
    live: list[str] = []
    for index in range(num_ops):
        roll = rng.random()
        if roll < 0.12:
            ops.append(["step"])
        elif roll < 0.30 or not live:
            stem = rng.choice(stems) if rng.random() < 0.8 else []
            tail = [rng.randrange(5) for _ in range(rng.randrange(1, 2 * unit))]
            rid = f"r{index}"
            ops.append(["new", rid, stem[:rng.randrange(1, len(stem) + 1)] + tail
                        if stem else tail, "s" if rng.random() < 0.05 else None])
            live.append(rid)
        elif roll < 0.78:
            ops.append(["run", rng.choice(live), rng.choice([1, unit, 2 * unit, 1 << 20]),
                        rng.randrange(5), rng.choice([0, 0, 0, 1, 2]), rng.random() < 0.85])
        elif roll < 0.88:
            ops.append(["free", live.pop(rng.randrange(len(live)))])
        elif roll < 0.93:
            ops.append(["preempt", rng.choice(live)])
        elif roll < 0.96:
            ops.append(["evict", sorted(rng.sample(range(1, num_blocks), 3))])
        elif roll < 0.98:
            ops.append(["reset"])
        else:
            ops.append(["stats"])
    return ops


def directed_jobs() -> list[dict[str, Any]]:
    """The worked examples of ../shared/reference/hybrid.md section 2 (requests A-D), a Mamba
    hit on a state cached in the same step, and a prompt state re-cached after eviction; for
    each layout under the engine's retention (0) and dense retention (None), block size 4."""
    prompt = list(range(100, 120))
    ops: list[Op] = []

    def request(rid: str, tokens: list[int], runs: int, budget: int = 1 << 20) -> None:
        ops.append(["new", rid, tokens, None])
        for _ in range(runs):
            ops.extend([["step"], ["run", rid, budget, 900, 0, True]])

    request("A", prompt, 9)
    ops.append(["free", "A"])
    for rid, tokens, runs in (("B", prompt + [900, 901, 902, 555, 556], 3),
                              ("C", prompt[:10] + [1, 2, 3, 4, 5, 6], 3), ("D", prompt, 1)):
        request(rid, tokens, runs)
        ops.append(["free", rid])
    request("S", prompt[:12] + [9, 9], 1)  # caches the state after 12 tokens in this step
    ops.extend([["new", "E", prompt[:12] + [6, 6, 6], None], ["run", "E", 1 << 20, 1, 0, True],
                ["step"], ["run", "E", 1 << 20, 1, 0, True], ["free", "S"], ["free", "E"]])
    request("F", [7] * 21, 1)  # the state at 20 is cached, evicted, then cached again
    ops.extend([["evict", list(range(1, 40))], ["step"], ["run", "F", 1 << 20, 1, 0, True],
                ["free", "F"], ["stats"]])
    jobs = []
    for layout in DEFAULT_LAYOUTS:
        for retention in (0, None):
            groups: list[list[Any]] = [["full"]]
            groups += [["swa", 8], ["swa", 8]] if "swa" in layout else []
            groups += [["mamba"]] if "mamba" in layout else []
            config = {"seed": 0, "layout": f"directed {layout}", "block_size": 4,
                      "groups": groups, "num_blocks": 40, "max_model_len": 256,
                      "max_in_flight_tokens": 256, "retention": retention, "caching": True}
            jobs.append({"config": config, "ops": ops})
            jobs.append({"config": dict(config, layout=f"directed full pool {layout}"),
                         "ops": _near_full_pool(prompt)})
    return jobs


def _near_full_pool(prompt: list[int]) -> list[Op]:
    """Admissions at the edge of the pool: for fillers of 0 to 156 tokens held throughout, a
    20-token prompt is prefilled and freed (its blocks cached but free), then a request that
    extends it is checked for the whole sequence: its hit, the windows' skipped blocks and the
    hit's free cached blocks decide whether it fits."""
    ops: list[Op] = []
    for filler in range(0, 160, 4):
        fill, first, extend = f"F{filler}", f"P{filler}", f"Q{filler}"
        if filler:
            ops.extend([["new", fill, [1000 + filler] * filler, None],
                        ["run", fill, 1 << 20, 1, 0, True]])
        ops.extend([["step"], ["new", first, prompt, None], ["run", first, 1 << 20, 900, 0, True],
                    ["free", first], ["step"],
                    ["new", extend, prompt + [filler, filler + 1, 7], None],
                    ["run", extend, 1 << 20, 2, 0, True], ["step"], ["free", extend]])
        if filler:
            ops.append(["free", fill])
    return ops


# -- driving one implementation (shared by both sides) -----------------------------------------
def event_view(event: Any) -> list[Any]:
    name = type(event).__name__
    if name == "BlockStored":
        extra = None if event.extra_keys is None else [
            None if keys is None else list(keys) for keys in event.extra_keys]
        return [name, list(event.block_hashes), event.parent_block_hash, list(event.token_ids),
                event.block_size, event.lora_name, extra, event.group_idx,
                event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window]
    if name == "BlockRemoved":
        return [name, list(event.block_hashes), event.medium, event.group_idx]
    return [name]


def _ids(blocks: Any) -> Any:
    return None if blocks is None else [list(group) for group in blocks.get_block_ids()]


def run_ops(ops: list[Op], api: dict[str, Any]) -> list[Any]:
    """Play vLLM's scheduler over ``api``; the observation trace, one entry per op."""
    manager = api["manager"]
    pool = manager.block_pool
    requests: dict[str, Any] = {}
    state: dict[str, str] = {}  # rid -> waiting / running
    trace: list[Any] = []
    for op in ops:
        kind = op[0]
        result: Any = None
        try:
            if kind == "step":
                manager.new_step_starts()
            elif kind == "new":
                requests[op[1]] = api["request"](op[1], op[2], op[3])
                state[op[1]] = "waiting"
            elif kind == "run" and op[1] in requests:
                result = _run(manager, api["split"], requests[op[1]], state, *op[2:])
            elif kind in ("free", "preempt") and op[1] in requests:
                request = requests[op[1]]
                manager.free(request)
                if kind == "free":
                    del requests[op[1]]
                else:
                    request.num_computed_tokens = 0
                    request.num_preemptions += 1
                    state[op[1]] = "waiting"
            elif kind == "evict":
                manager.evict_blocks(set(op[1]))
            elif kind == "reset":
                result = manager.reset_prefix_cache()
            elif kind == "stats":
                stats = manager.make_prefix_cache_stats()
                result = [stats.requests, stats.queries, stats.hits, stats.preempted_requests,
                          stats.preempted_queries, stats.preempted_hits, stats.reset]
        except Exception as error:  # noqa: BLE001 - a raise on one side is an observation
            result = ["raised", type(error).__name__]
        events = manager.take_events()
        trace.append([op, result, api["free_queue"](pool),
                      [pool.blocks[i].ref_cnt for i in range(1, pool.num_gpu_blocks)],
                      {rid: [list(g) for g in manager.get_block_ids(rid)]
                       for rid in sorted(requests)},
                      [event_view(event) for event in events], api["encode"](events)])
    return trace


def _run(manager: Any, split: Any, request: Any, state: dict[str, str], budget: int,
         token: int, lookahead: int, full_fit: bool) -> Any:
    if state[request.request_id] == "waiting":
        blocks, hit, junction = manager.get_computed_blocks(request)
        request.shared_prefix_boundary = junction
        count = split(request, min(budget, request.num_tokens - hit), hit)
        result: list[Any] = [_ids(blocks), hit, junction, count]
        if count == 0:
            return result
        new = manager.allocate_slots(request, count, hit, blocks,
                                     full_sequence_must_fit=full_fit)
        result.append(_ids(new))
        if new is None:
            return result
        manager.record_prefix_cache_stats(request, hit)
        request.num_computed_tokens = hit + count
        state[request.request_id] = "running"
    elif request.num_computed_tokens < request.num_tokens:
        count = split(request, min(budget, request.num_tokens - request.num_computed_tokens), 0)
        if count == 0:
            return ["chunk", 0]
        new = manager.allocate_slots(request, count)
        result = ["chunk", count, _ids(new)]
        if new is None:
            return result
        request.num_computed_tokens += count
    else:
        new = manager.allocate_slots(request, 1, num_lookahead_tokens=lookahead)
        result = ["decode", _ids(new)]
        if new is None:
            return result
        request.num_computed_tokens += 1
    if request.num_computed_tokens == request.num_tokens:
        request.append_output_token_ids(token)
    return result


def build_config(config: dict[str, Any], classes: dict[str, Any], dtype: Any) -> Any:
    size = config["block_size"]
    groups = []
    for index, group in enumerate(config["groups"]):
        if group[0] == "full":
            spec = classes["FullAttentionSpec"](block_size=size, num_kv_heads=1, head_size=8,
                                                dtype=dtype)
        elif group[0] == "swa":
            spec = classes["SlidingWindowSpec"](block_size=size, num_kv_heads=1, head_size=8,
                                                dtype=dtype, sliding_window=group[1])
        else:
            spec = classes["MambaSpec"](block_size=size, shapes=((2, 8),), dtypes=(dtype,),
                                        mamba_cache_mode="align")
        groups.append(classes["KVCacheGroupSpec"]([f"layer.{index}"], spec))
    return classes["KVCacheConfig"](num_blocks=config["num_blocks"], kv_cache_tensors=[],
                                    kv_cache_groups=groups,
                                    prefix_cache_retention_interval=config["retention"])


def manager_arguments(config: dict[str, Any]) -> dict[str, Any]:
    return {"max_model_len": config["max_model_len"],
            "scheduler_block_size": config["block_size"],
            "hash_block_size": config["block_size"],
            "max_in_flight_tokens": config["max_in_flight_tokens"],
            "enable_caching": config["caching"], "enable_kv_cache_events": True,
            "log_stats": True}


# -- vLLM side (peer interpreter) ----------------------------------------------------------------
def vllm_side(config: dict[str, Any], ops: list[Op]) -> list[Any]:
    os.environ["PYTHONHASHSEED"] = str(config["seed"])
    import msgspec
    import torch
    import vllm.v1.kv_cache_interface as interface
    from vllm.distributed.kv_events import KVEventBatch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request

    init_none_hash(sha256_cbor)
    kv_config = build_config(config, vars(interface), torch.float32)
    manager = KVCacheManager(kv_config, **manager_arguments(config))
    hasher = get_request_block_hasher(config["block_size"], sha256_cbor)
    params = SamplingParams(max_tokens=1 << 20)
    encoder = msgspec.msgpack.Encoder()
    size = config["block_size"]
    # The scheduler's own split, run on the scheduler state it reads (vLLM's defaults: no
    # EAGLE, no sub-block hits, no checkpoint blocks, no lookahead hashing).
    scheduler = SimpleNamespace(
        cache_config=SimpleNamespace(block_size=size), block_size=size, hash_block_size=size,
        mamba_partial_cache_hit=False, use_eagle_block_drop=False, num_hash_lookahead_tokens=0,
        mamba_has_prefill_checkpoint_blocks=False, mamba_prefill_checkpoint_alignment=None,
        max_num_scheduled_tokens=MAX_PREFILL_TOKENS, mamba_shared_prefix_checkpoint=False,
        scheduler_config=SimpleNamespace(long_prefill_token_threshold=0))
    mamba = any(group[0] == "mamba" for group in config["groups"])

    def split(request: Any, count: int, hit: int) -> int:
        if not mamba:
            return count
        return int(Scheduler._mamba_block_aligned_split(scheduler, request, count, hit))

    return run_ops(ops, {
        "manager": manager, "split": split,
        "request": lambda rid, tokens, salt: Request(rid, list(tokens), params, None,
                                                     cache_salt=salt, block_hasher=hasher),
        "free_queue": lambda pool: [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        "encode": lambda events: encoder.encode(KVEventBatch(0.0, events, 0)).hex()})


# -- kvstate side ----------------------------------------------------------------------------------
def kvstate_side(config: dict[str, Any], ops: list[Op], workdir: str) -> tuple[list[Any], list[str]]:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import kvstate.vllm.kv_cache_interface as interface
    from kvstate.invariants import check
    from kvstate.log import Recorder
    from kvstate.replay import replay_path
    from kvstate.vllm import KVCacheManager, KVEventBatch, Request
    from kvstate.vllm.kv_events import decode_event_batch, encode_event_batch

    seed = str(config["seed"])
    kv_config = build_config(config, vars(interface), "float32")
    manager: Any = KVCacheManager(kv_config, **manager_arguments(config), hash_seed=seed,
                                  keep_events=False)
    problems: list[str] = []

    def watch(_event: Any, view: Any) -> None:
        if not problems:
            problems.extend(f"invariant: {v}" for v in check(view))

    def encode(events: list[Any]) -> str:
        batch = KVEventBatch(0.0, events, 0)
        for wire_format in ("map", "array"):  # both forms must read back to the same batch
            if decode_event_batch(encode_event_batch(batch, wire_format)) != batch:
                problems.append(f"{wire_format} form does not round-trip: {events}")
        return encode_event_batch(batch, "map").hex()

    manager.engine.subscribe(watch)
    path = os.path.join(workdir, f"seed{seed}.kvlog")
    recorder = Recorder(manager, path, fsync=False)
    trace = run_ops(ops, {
        "manager": manager,
        "split": lambda request, count, hit: manager.mamba_block_aligned_split(
            request, count, hit, max_prefill_tokens=MAX_PREFILL_TOKENS)
        if any(group[0] == "mamba" for group in config["groups"]) else count,
        "request": lambda rid, tokens, salt: Request(rid, tokens, config["block_size"],
                                                     hash_seed=seed, cache_salt=salt),
        "free_queue": lambda pool: pool.free_block_ids(), "encode": encode})
    recorder.close()
    replayed = replay_path(path)
    if not replayed.ok or replayed.state != manager.engine.state:
        problems.append(f"the recorded log does not replay: {replayed.failure}")
    return trace, problems


def compare(ours: list[Any], theirs: list[Any]) -> str | None:
    labels = ["op", "result", "free queue", "ref_cnt", "block tables", "events", "event bytes"]
    for index, (mine, other) in enumerate(zip(ours, theirs, strict=False)):
        for label, a, b in zip(labels, mine, other, strict=True):
            if a != b:
                return f"call {index} {mine[0]}: {label} differs\n  kvstate: {a}\n  vllm:    {b}"
    return None if len(ours) == len(theirs) else f"lengths {len(ours)} vs {len(theirs)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-python", help="interpreter with vLLM 0.33 installed")
    parser.add_argument("--layouts", nargs="+", default=list(DEFAULT_LAYOUTS), choices=LAYOUTS,
                        help="full and swa-only: one group (kvstate's one-group manager, or the "
                             "grouped one for a window with sparse retention)")
    parser.add_argument("--block-sizes", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--ops", type=int, default=150)
    parser.add_argument("--vllm-side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.vllm_side:
        json.dump([vllm_side(job["config"], job["ops"]) for job in json.load(sys.stdin)],
                  sys.stdout)
        return 0
    if not args.peer_python:
        parser.error("--peer-python is required")
    jobs: list[dict[str, Any]] = directed_jobs()
    for layout in args.layouts:
        for size in args.block_sizes:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                config = make_config(seed, layout, size)
                jobs.append({"config": config,
                             "ops": make_ops(seed, args.ops, size, config["num_blocks"])})
    env = dict(os.environ, PYTHONWARNINGS="ignore", VLLM_LOGGING_LEVEL="ERROR")
    proc = subprocess.run([args.peer_python, os.path.abspath(__file__), "--vllm-side"],
                          input=json.dumps(jobs), capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        print(proc.stderr[-4000:], file=sys.stderr)
        return 2
    failures = 0
    tally: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for job, theirs in zip(jobs, json.loads(proc.stdout), strict=True):
            config = job["config"]
            ours, problems = kvstate_side(config, job["ops"], workdir)
            row = tally.setdefault(f"{config['layout']} bs={config['block_size']}",
                                   dict.fromkeys(("seeds", "calls", "events", "hits",
                                                  "refused", "differ"), 0))
            row["seeds"] += 1
            row["calls"] += len(ours)
            for step in theirs:
                row["events"] += len(step[5])
                result = step[1]
                if step[0][0] == "run" and isinstance(result, list) and len(result) == 5:
                    row["hits"] += result[1] > 0
                    row["refused"] += result[4] is None
            problem = compare(json.loads(json.dumps(ours)), theirs)
            if problems:
                problem = (problem or "") + "\n  " + problems[0]
            if problem:
                failures += 1
                row["differ"] += 1
                print(f"seed {config['seed']} {config}: {problem}")
    print("| layout | seeds | calls | KV events | admissions with hits | admissions refused "
          "| seeds with differences |\n|---|---:|---:|---:|---:|---:|---:|")
    for name, row in tally.items():
        print(f"| {name} | {row['seeds']} | {row['calls']} | {row['events']} | {row['hits']} | "
              f"{row['refused']} | {row['differ']} |")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
