"""``kvstate simulate``: replay a request trace through the planner at one or more capacities.

    kvstate simulate TRACE|--sample --capacity 1e6,3M,5859b [--policy lru,vllm,fifo]
                     [--warmup 0.5] [--granularity block|token] [--page-size P]
                     [--block-size B] [--eviction-unit node|page] [--no-decode]
                     [--cache-output] [--max-running R [--step-ms MS]] [--force]
                     [--record LOG] [--out DIR] [--json] [--limit N] [--[no-]progress]

Capacities are tokens (``3M``, ``1e6``, ``250k``) or, with a ``b`` suffix,
pages of the run's unit (``5859b``: 5,859 trace blocks in block
granularity).  Every (policy, capacity) pair is one run, streamed from the
file again.  By default requests run one at a time in file order; with
--max-running they follow the trace's arrival times under continuous
batching (decode iterations of --step-ms), and waits and retractions are
counted.  ``--policy vllm`` is vLLM's free-queue LRU, run on the block-mode
core (one request at a time, block granularity).  ``--json`` prints one JSON
object per run.  ``--out`` writes
results.csv, results.json and hit_rate.png (one line per policy).

``--sample`` runs the trace shipped inside kvstate: the first 1,000 requests
of the Mooncake FAST'25 conversation trace (Apache-2.0; provenance in
kvstate/traces/data/README.md).  The whole trace is read once before the
first run, so a malformed line fails at once.  A trace without prefix data
(the Azure 2023 CSVs carry only token counts) has a hit rate of 0 at any
capacity: that is said up front, and the runs are skipped unless
--max-running (waits and retractions under batching) or --force asks for
them.  Settings known to be slow get a one-line warning with the faster
choice.  In block granularity one page is one trace block: a --record log
has page_size 1, its meta says how many tokens one slot stands for.

Exit 0 on success (or nothing to run), 1 on a malformed trace (file:line:
reason on stderr), 2 on a usage error or a file that cannot be read.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Any

from kvstate.commands._progress import add_progress_option
from kvstate.traces import TRACE_FORMATS

_CAPACITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmg]?)\s*(b|blocks?|pages?)?\s*$", re.I)
_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}


def parse_capacity(text: str) -> tuple[float, bool]:
    """``(amount, in_pages)`` for one capacity: ``3M`` -> (3e6, False), ``5859b`` -> (5859, True)."""
    match = _CAPACITY.match(text)
    if match is None:
        raise ValueError(f"bad capacity {text!r}: use tokens like 3M, 1e6 or pages like 5859b")
    amount = float(match.group(1)) * _SCALE[match.group(2).lower()]
    if not math.isfinite(amount):
        raise ValueError(f"capacity {text!r} is too large")
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
        "trace", metavar="TRACE", nargs="?",
        help="Mooncake .jsonl, kv-cache-tester .tar.xz/.json/dir, Azure .csv (or --sample)",
    )
    parser.add_argument(
        "--sample", action="store_true",
        help="use the sample trace shipped with kvstate (1,000 Mooncake conversation requests)",
    )
    parser.add_argument(
        "--force", action="store_true",
        help="run even a trace without prefix data, whose hit rate is 0 by construction",
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
    add_progress_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Validate the arguments, then hand over to ``_simulate_run`` (kept apart for size)."""
    from kvstate.commands._simulate_run import run_simulate

    return run_simulate(args)
