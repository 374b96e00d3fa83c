"""Benchmark the core: µs per applied event vs pool size, and kvstate vs the real peers.

    python tools/bench_core.py                      # both parts, writes docs/benchmarks-core.md
    python tools/bench_core.py --skip-peers         # only the reducer scaling part
    PEERS=~/kvstate-peers python tools/bench_core.py --requests 2000

Part 1 applies the same event mix at 10k, 100k and 1M pages and reports the
median µs per event: flat numbers mean O(log n) updates.  Part 2 runs
../shared/peers/sim.py for kvstate (tools/peer_kvstate.py, events recorded)
and for vLLM 0.33 / SGLang 0.5.23 in their venvs, in the same run, on the
synthetic workload and (with --trace) the Mooncake trace.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kvstate import Geometry, apply, initial_state
from kvstate.events import Allocate, Append, Evict, Free, Insert, Lock, ReqAlloc, Unlock

ROOT = Path(__file__).resolve().parent.parent
PEERS_DIR = ROOT.parent / "shared" / "peers"


def _timed(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        count = fn()
        samples.append((time.perf_counter() - start) * 1e6 / count)
    return statistics.median(samples)


def scaling(num_pages: int, repeats: int = 5) -> dict[str, float]:
    """Median µs per event for each event kind on a pool of ``num_pages`` pages (page size 16)."""
    size = 16
    base = initial_state(Geometry(num_pages=num_pages, page_size=size, num_rows=256, row_width=1 << 16))
    rows = tuple(range(1, 257))
    base = apply(base, ReqAlloc(rows))
    # Half the pool allocated, so maps are big.
    half = list(base.free_pages.head(num_pages // 2))
    base = apply(base, Allocate(tuple(half)))

    def alloc_free() -> int:
        state = base
        for _ in range(100):
            pages = tuple(state.free_pages.head(16))
            state = apply(state, Allocate(pages))
            state = apply(state, Free(pages, at_head=True))
        return 200

    def decode_step() -> int:
        """16 steps of a 256-request decode batch: one page each at step 0, then continuing slots."""
        state = base
        first_pages = tuple(state.free_pages.head(256))
        for step in range(16):
            fresh = first_pages if step == 0 else ()
            items = tuple((r, (first_pages[i] * size + step,)) for i, r in enumerate(rows))
            state = apply(state, Allocate(fresh, items))
            state = apply(state, Append(tuple((r, step + 1) for r in rows)))
        return 16 * 256  # request-steps (two batched events per step)

    def insert_evict() -> int:
        state = base
        for i in range(50):
            pages = tuple(state.free_pages.head(4))
            state = apply(state, Allocate(pages))
            slots = tuple(p * size + k for p in pages for k in range(size))
            node = state.next_node_id
            state = apply(state, Insert(0, tuple(range(i * 64, i * 64 + 64)), slots, node, state.clock + 1))
            state = apply(state, Lock(node))
            state = apply(state, Unlock(node))
            state = apply(state, Evict((node,), at_head=True))
        return 250

    return {
        "allocate+free (16 pages)": _timed(alloc_free, repeats),
        "decode step (per request-step)": _timed(decode_step, repeats),
        "insert/lock/unlock/evict (4 pages)": _timed(insert_evict, repeats),
    }


def run_sim(python: str, peer: str, page_size: int, extra: list[str], env: dict[str, str],
            tag: str = "") -> dict:
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-{peer}-{page_size}{tag}.json"
    cmd = [python, str(PEERS_DIR / "sim.py"), "--peer", peer, "--page-size", str(page_size),
           *extra, "--out", str(out)]
    subprocess.run(cmd, check=True, env=env, capture_output=True, cwd=PEERS_DIR)
    return json.loads(out.read_text())["runs"][0]


def peers_table(requests: int, trace: str | None) -> list[dict]:
    peers_home = Path(os.environ.get("PEERS", Path.home() / "kvstate-peers"))
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'tools'}:{PEERS_DIR}")
    # (python, peer, page size, label, run with KVSTATE_GC_TUNED=1)
    configs = [(sys.executable, "peer_kvstate", 16, "kvstate (page 16)", False),
               (sys.executable, "peer_kvstate", 16, "kvstate (page 16, GC tuned)", True),
               (sys.executable, "peer_kvstate", 1, "kvstate (page 1)", False),
               (sys.executable, "peer_kvstate", 1, "kvstate (page 1, GC tuned)", True)]
    if (peers_home / "venv-vllm/bin/python").exists():
        configs.append((str(peers_home / "venv-vllm/bin/python"), "peer_vllm", 16,
                        "vLLM 0.33 (block 16)", False))
    if (peers_home / "venv-sglang/bin/python").exists():
        sglang = str(peers_home / "venv-sglang/bin/python")
        configs += [(sglang, "peer_sglang", 16, "SGLang 0.5.23 RadixCache (page 16)", False),
                    (sglang, "peer_sglang", 1, "SGLang 0.5.23 RadixCache (page 1)", False)]
    workloads = [("synthetic", ["--requests", str(requests), "--seed", "0", "--capacity", "60000"])]
    if trace:
        workloads.append(("mooncake", ["--trace", trace, "--requests", str(requests),
                                       "--capacity", "200000", "--max-input", "8192",
                                       "--max-output", "256"]))
    rows = []
    for workload, extra in workloads:
        for python, peer, page_size, label, tuned in configs:
            run_env = dict(env, KVSTATE_GC_TUNED="1") if tuned else env
            result = run_sim(python, peer, page_size, extra, run_env, "-gc" if tuned else "")
            rows.append({"workload": workload, "peer": label, **{k: result[k] for k in (
                "us_per_decode_request_step", "us_per_admission", "us_per_finish",
                "hit_rate_tokens", "evicted_tokens")}})
            print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--skip-peers", action="store_true")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--trace", default=str(ROOT.parent / "shared/traces/conversation_trace.jsonl"))
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks-core.md"))
    args = parser.parse_args(argv)
    lines = ["## Core: µs per applied event vs pool size (page size 16, half the pool allocated)", "",
             "| pages | allocate+free (16 pages) | decode step (per request-step) | "
             "insert/lock/unlock/evict |", "|---|---|---|---|"]
    for num_pages in (int(s) for s in args.sizes.split(",")):
        result = scaling(num_pages)
        print(num_pages, result, file=sys.stderr)
        lines.append(f"| {num_pages:,} | " + " | ".join(f"{v:.2f}" for v in result.values()) + " |")
    if not args.skip_peers:
        trace = args.trace if Path(args.trace).exists() else None
        rows = peers_table(args.requests, trace)
        lines += ["", "## kvstate vs the peers, same driver, same run (../shared/peers/sim.py)", "",
                  "| workload | peer | µs / decode request-step | µs / admission | µs / finish "
                  "| token hit rate | evicted tokens |", "|---|---|---|---|---|---|---|"]
        for row in rows:
            lines.append(f"| {row['workload']} | {row['peer']} | {row['us_per_decode_request_step']:.2f} | "
                         f"{row['us_per_admission']:.0f} | {row['us_per_finish']:.0f} | "
                         f"{row['hit_rate_tokens']:.3f} | {row['evicted_tokens']} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
