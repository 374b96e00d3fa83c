"""``kvstate simulate``: replay a request trace through the planner at one or more capacities.

    kvstate simulate TRACE --capacity 1e6,3M,5859b [--policy lru,vllm,fifo] [--warmup 0.5]
                     [--granularity block|token] [--page-size P] [--block-size B]
                     [--eviction-unit node|page] [--no-decode] [--cache-output]
                     [--max-running R [--step-ms MS]]
                     [--record LOG] [--out DIR] [--json] [--limit N]

Capacities are tokens (``3M``, ``1e6``, ``250k``) or, with a ``b`` suffix,
pages of the run's unit (``5859b``: 5,859 trace blocks in block
granularity).  Every (policy, capacity) pair is one run, streamed from the
file again.  By default requests run one at a time in file order; with
--max-running they follow the trace's arrival times under continuous
batching (decode iterations of --step-ms), and waits and retractions are
counted.  ``--policy vllm`` is vLLM's free-queue LRU, run on the block-mode
core (one request at a time, block granularity).  ``--json`` prints one JSON
object per run.  ``--out`` writes
results.csv, results.json and hit_rate.png (one line per policy).  Exit 0 on
success, 1 on a malformed trace, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from kvstate.planner.policy import PolicyError, load_policy
from kvstate.simulate.driver import pages_needed, simulate
from kvstate.simulate.output import write_results
from kvstate.simulate.point import SimulationError
from kvstate.simulate.policies import VLLM_POLICY
from kvstate.simulate.settings import Granularity, SimulationResult, SimulationSettings
from kvstate.traces import TRACE_FORMATS, TraceFormatError, read_trace

_CAPACITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmg]?)\s*(b|blocks?|pages?)?\s*$", re.I)
_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}


def parse_capacity(text: str) -> tuple[float, bool]:
    """``(amount, in_pages)`` for one capacity: ``3M`` -> (3e6, False), ``5859b`` -> (5859, True)."""
    match = _CAPACITY.match(text)
    if match is None:
        raise ValueError(f"bad capacity {text!r}: use tokens like 3M, 1e6 or pages like 5859b")
    amount = float(match.group(1)) * _SCALE[match.group(2).lower()]
    if amount < 1:
        raise ValueError(f"capacity {text!r} must be at least 1")
    return amount, match.group(3) is not None


def _split_list(values: list[str]) -> list[str]:
    return [part for value in values for part in value.split(",") if part.strip()]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="replay a trace through the planner; hit rate vs capacity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "trace", metavar="TRACE", help="Mooncake .jsonl, kv-cache-tester .tar.xz/.json/dir, Azure .csv"
    )
    parser.add_argument(
        "--format", choices=TRACE_FORMATS, default=None, help="trace format (default: from the name)"
    )
    parser.add_argument(
        "--capacity",
        action="append",
        required=True,
        metavar="CAP",
        help="capacity in tokens (3M, 1e6) or pages (5859b); comma list or repeat for a sweep",
    )
    parser.add_argument(
        "--policy",
        action="append",
        default=None,
        metavar="NAME",
        help="lru (default: leaf LRU, SGLang), vllm (vLLM free-queue LRU), fifo, lfu or "
        "module:Class (an EvictionPolicy, imported from the current directory, as check --policy); "
        "comma list or repeat",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="fraction of requests that warm the cache unmeasured (default 0)",
    )
    parser.add_argument(
        "--granularity",
        choices=("block", "token"),
        default=None,
        help="block: one page per trace hash block (default when the trace has hashes); "
        "token: synthetic token ids in pages of --page-size",
    )
    parser.add_argument(
        "--page-size", type=int, default=16, metavar="P", help="tokens per page (token granularity)"
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=None,
        metavar="B",
        help="hash block size of a Mooncake-format trace (default 512)",
    )
    parser.add_argument(
        "--eviction-unit",
        choices=("node", "page"),
        default="node",
        help="node: evict whole radix nodes (SGLang); page: one page at a time (per-block trie)",
    )
    parser.add_argument(
        "--no-decode",
        dest="decode",
        action="store_false",
        help="do not allocate output tokens (prefill-only cache, kvcache-simulator semantics)",
    )
    parser.add_argument(
        "--max-running",
        type=int,
        default=None,
        metavar="R",
        help="replay arrival times with continuous batching, at most R requests at once "
        "(default: one request at a time in file order)",
    )
    parser.add_argument(
        "--step-ms",
        type=float,
        default=20.0,
        metavar="MS",
        help="decode iteration time under --max-running (default 20 ms)",
    )
    parser.add_argument("--cache-output", action="store_true", help="cache generated tokens at finish")
    parser.add_argument("--record", metavar="LOG", help="record the run as a kvstate log (one run only)")
    parser.add_argument("--out", metavar="DIR", help="write results.csv, results.json and hit_rate.png here")
    parser.add_argument("--json", action="store_true", help="print one JSON object per run")
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="use only the first N requests")
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress on stderr (default: when stderr is a terminal)",
    )
    parser.set_defaults(func=run)


def _usage(message: str) -> int:
    print(f"kvstate simulate: {message}", file=sys.stderr)
    return 2


def _progress_printer(label: str, total: int) -> Any:
    started = time.monotonic()

    def show(done: int) -> None:
        width = 30
        filled = width * done // total if total else width
        rate = done / max(time.monotonic() - started, 1e-9)
        bar = "#" * filled + "." * (width - filled)
        end = "\n" if done >= total else ""
        print(
            f"\r{label} [{bar}] {done}/{total} requests, {rate:,.0f}/s", end=end, file=sys.stderr, flush=True
        )

    return show


def run(args: argparse.Namespace) -> int:
    try:
        capacities = [parse_capacity(text) for text in _split_list(args.capacity)]
    except ValueError as error:
        return _usage(str(error))
    policies = _split_list(args.policy or ["lru"])
    try:
        for name in policies:
            if name != VLLM_POLICY:
                load_policy(name)
    except PolicyError as error:
        return _usage(str(error))
    if not 0.0 <= args.warmup < 1.0:
        return _usage(f"--warmup must be in [0, 1), got {args.warmup}")
    if args.page_size < 1 or (args.block_size is not None and args.block_size < 1):
        return _usage("--page-size and --block-size must be positive")
    if args.record and len(capacities) * len(policies) != 1:
        return _usage("--record needs exactly one capacity and one policy")
    path = Path(args.trace)
    if not path.exists():
        return _usage(f"no such trace: {path}")

    def stream() -> Any:
        return read_trace(path, args.format, limit=args.limit, block_size=args.block_size, with_tokens=False)

    try:
        first = next(iter(stream()), None)
        granularity: Granularity = args.granularity or (
            "block" if first is not None and first.block_size else "token"
        )
        unit = first.block_size if granularity == "block" and first is not None else args.page_size
        shape = SimulationSettings(capacity_tokens=1, granularity=granularity, page_size=args.page_size)
        request_count = 0
        page_bound = 0
        for request in stream():
            request_count += 1
            page_bound += pages_needed((request,), shape, max(unit, 1))
    except TraceFormatError as error:
        print(f"kvstate simulate: {error}", file=sys.stderr)
        return 1
    show_progress = sys.stderr.isatty() if args.progress is None else args.progress
    results: list[SimulationResult] = []
    for policy in policies:
        for amount, in_pages in capacities:
            tokens = int(amount * unit) if in_pages else int(amount)
            try:
                settings = SimulationSettings(
                    capacity_tokens=tokens,
                    policy=policy,
                    warmup=args.warmup,
                    granularity=granularity,
                    page_size=args.page_size,
                    eviction_unit=args.eviction_unit,
                    cache_output=args.cache_output,
                    decode=args.decode,
                    max_running=args.max_running,
                    step_ms=args.step_ms,
                )
                progress = (
                    _progress_printer(f"{policy} @ {tokens:,}", request_count) if show_progress else None
                )
                result = simulate(
                    stream(),
                    settings,
                    request_count,
                    record=args.record,
                    progress=progress,
                    page_bound=page_bound,
                )
            except (SimulationError, ValueError) as error:
                if isinstance(error, TraceFormatError):
                    print(f"kvstate simulate: {error}", file=sys.stderr)
                    return 1
                return _usage(str(error))
            results.append(result)
            if args.json:
                print(json.dumps(result.to_json()), flush=True)
            else:
                print(
                    f"{policy:>6} capacity {tokens:>13,} tokens ({result.capacity_pages:,} pages): "
                    f"hit {result.hit_rate_tokens:.4f} tokens, {result.hit_rate_blocks:.4f} blocks; "
                    f"evicted {result.evicted_pages:,}; peak {result.peak_pages:,} pages; "
                    f"rejected {result.rejected_requests}, retracted {result.retracted_requests}, "
                    f"waited {result.waited_requests}",
                    flush=True,
                )
    if args.out:
        for written in write_results(results, args.out):
            if not args.json:
                print(f"wrote {written}")
    return 0
