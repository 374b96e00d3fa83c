"""Benchmark ``kvstate simulate`` on a whole trace: requests/s, us/request, peak memory.

    python tools/bench_simulate.py ../shared/traces/conversation_trace.jsonl --capacity 3M [--record]
        [--policy lru|vllm|fifo|lfu] [--eviction-unit page] [--no-decode] [--warmup 0.5]

Runs one capacity point in this process (default: SGLang leaf LRU with node
eviction, outputs decoded, whole-trace window; ``--policy vllm`` runs vLLM's
free-queue LRU on the block-mode core) and prints one JSON object with the
process CPU time, wall time and peak RSS (``resource.getrusage``).  With
``--record`` the run also writes a kvstate log to a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

from kvstate.commands.simulate import parse_capacity
from kvstate.simulate import SimulationSettings, simulate
from kvstate.traces import read_trace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("trace")
    parser.add_argument("--capacity", default="3M")
    parser.add_argument("--eviction-unit", choices=("node", "page"), default="node")
    parser.add_argument("--policy", default="lru")
    parser.add_argument("--warmup", type=float, default=0.0)
    parser.add_argument("--no-decode", dest="decode", action="store_false")
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args(argv)
    amount, in_pages = parse_capacity(args.capacity)
    count = sum(1 for _ in read_trace(args.trace, limit=args.limit, with_tokens=False))
    first = next(iter(read_trace(args.trace, limit=1, with_tokens=False)))
    tokens = int(amount * first.block_size) if in_pages else int(amount)
    settings = SimulationSettings(
        capacity_tokens=tokens,
        policy=args.policy,
        warmup=args.warmup,
        eviction_unit=args.eviction_unit,
        decode=args.decode,
    )
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "run.kvlog" if args.record else None
        wall, cpu = time.perf_counter(), time.process_time()
        result = simulate(
            read_trace(args.trace, limit=args.limit, with_tokens=False), settings, count, record=log
        )
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        log_bytes = log.stat().st_size if log is not None else 0
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "trace": Path(args.trace).name,
                "capacity_tokens": tokens,
                "policy": args.policy,
                "eviction_unit": args.eviction_unit,
                "warmup": args.warmup,
                "decode": args.decode,
                "record": args.record,
                "requests": result.requests,
                "hit_rate_tokens": result.hit_rate_tokens,
                "wall_s": round(wall, 2),
                "cpu_s": round(cpu, 2),
                "requests_per_cpu_s": round(result.requests / cpu, 1) if cpu else None,
                "us_per_request_cpu": round(1e6 * cpu / result.requests, 1) if result.requests else None,
                "peak_rss_mib": round(peak_kib / 1024, 1),
                "log_bytes": log_bytes,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
