"""``kvstate simulate``: replay a request trace through the planner at one or more capacities.

    kvstate simulate TRACE|--sample --capacity 1e6,3M,5859b [--policy lru,vllm,fifo]
                     [--warmup 0.5] [--granularity block|token] [--page-size P]
                     [--block-size B] [--eviction-unit node|page] [--no-decode]
                     [--cache-output] [--max-running R [--step-ms MS]] [--force]
                     [--record LOG] [--out DIR] [--json] [--limit N] [--[no-]progress]
    kvstate simulate TRACE|--sample --model NAME [--model ...] --memory 40GiB|--capacity 3M
                     [--swa-full-tokens-ratio 0.8] [--mamba-full-memory-ratio 0.9]
                     [--warmup W] [--no-decode] [--json] [--limit N]

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

``--model`` compares a hybrid layout (sliding-window or Mamba layers) with
the same memory treated as full attention: a named model (``gpt-oss-20b``,
``gemma-3-27b``, ``llama-4-scout``, ``qwen3-next-80b-a3b``, ``nemotron-h-8b``,
or ``all``), ``custom:full=8,swa=40,window=1024,kv_heads=8,head_dim=128``
(plus ``mamba=N,state_bytes=B`` for Mamba layers, ``dtype_bytes``,
``mamba_chunk``), or a .json file of those keys.  ``--memory`` is the budget
for KV and states (``40GiB``); ``--capacity`` gives it instead as the tokens
a full-attention pool of that size holds.  For each layout and budget it
prints KV bytes per token, SGLang 0.5.23's pools, the largest batch at the
trace's median and p90 request length, and three hit rates: the budget as a
full-attention pool, the hybrid's full-attention pool under the
full-attention hit rule, and the hybrid under SGLang's hybrid rules (run
through kvstate's SGLang front end; docs/results.md, section 7).

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
_MEMORY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]i?b?|b)?\s*$", re.I)
_MEMORY_SCALE = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
                 "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40}
MAX_MEMORY = 1 << 60


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


def parse_memory(text: str) -> int:
    """Bytes of one ``--memory`` value: ``40GiB`` (binary), ``80GB`` / ``80G`` (decimal), ``1e10``."""
    match = _MEMORY.match(text)
    if match is None:
        raise ValueError(f"bad memory {text!r}: use bytes like 40GiB, 80GB or 1e10")
    suffix = (match.group(2) or "").lower()
    scale = _MEMORY_SCALE[suffix[:-1] if suffix.endswith("b") else suffix]
    amount = float(match.group(1)) * scale
    if not math.isfinite(amount) or amount > MAX_MEMORY:
        raise ValueError(f"memory {text!r} is more than 1 EiB (2^60 bytes)")
    if amount < 1:
        raise ValueError(f"memory {text!r} must be at least 1 byte")
    return int(amount)


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
        default=None,
        metavar="CAP",
        help="capacity in tokens (3M, 1e6) or pages (5859b); comma list or repeat for a sweep "
        "(with --model: the memory a full-attention pool of that many tokens takes)",
    )
    parser.add_argument(
        "--model",
        action="append",
        default=None,
        metavar="NAME",
        help="hybrid layout: gpt-oss-20b, gemma-3-27b, llama-4-scout, qwen3-next-80b-a3b, "
        "nemotron-h-8b, all, custom:full=N,swa=N,window=N,kv_heads=N,head_dim=N[,mamba=N,"
        "state_bytes=B] or a .json file; repeat for several",
    )
    parser.add_argument(
        "--memory",
        action="append",
        default=None,
        metavar="SIZE",
        help="with --model: memory for KV and states (40GiB, 80GB); comma list or repeat",
    )
    parser.add_argument(
        "--swa-full-tokens-ratio", default="0.8", metavar="R",
        help="with --model: SGLang's SWA pool size over its full pool (default 0.8)",
    )
    parser.add_argument(
        "--mamba-full-memory-ratio", default="0.9", metavar="R",
        help="with --model: SGLang's Mamba state memory over the KV memory (default 0.9, at most 100)",
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
    # A value that starts with a minus and a digit ("--memory -5GiB") is a value, so our own
    # parser names what is wrong with it; no option of this command starts with a digit.
    parser._negative_number_matcher = re.compile(r"^-\.?[0-9]")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Validate the arguments, then hand over to ``_simulate_run`` (kept apart for size)."""
    from kvstate.commands._simulate_run import run_simulate

    return run_simulate(args)
