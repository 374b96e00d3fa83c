"""Reference prefix-cache hit rates computed straight from trace block hashes.

The command line of the independent reference simulator in ``tools/trace_ref``
(which imports nothing from ``kvstate``; its package docstring has the exact
definitions written into every result).  This module owns only argument
parsing and the ``run_*`` commands, which read trace files and return new
JSON-ready dicts; it re-exports the simulator names its callers use
(``BlockTrace``, ``infinite``, ``leaf_lru``, ``fifo``, ``vllm_free_queue``), so
that ``tools.trace_hit_rates.leaf_lru`` and friends keep working.

Usage (from the repository root; ``../shared`` holds the traces):

    python tools/trace_hit_rates.py mooncake ../shared/traces/conversation_trace.jsonl
    python tools/trace_hit_rates.py kvsim ../shared/traces/conversation_trace.jsonl --kvsim-python PY
    python tools/trace_hit_rates.py fig9 ../shared/traces/conversation_trace.jsonl
    python tools/trace_hit_rates.py kvtester ../shared/traces/kv-cache-tester/kv-cache-tester-traces.tar.xz
    python tools/trace_hit_rates.py azure ../shared/traces/azure_llm_inference_2023/*.csv

(``python -m tools.trace_hit_rates CMD ...`` works too.)  Each prints a JSON
document (``--out FILE`` also writes it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Run as ``python tools/trace_hit_rates.py`` (or loaded by file path, as the tests do),
# sys.path[0] is tools/ and the ``tools`` package is not importable: add the repo root.
_REPO_ROOT = str(Path(__file__).resolve().parents[1])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from tools.trace_ref.candidates import vllm_free_queue  # noqa: E402
from tools.trace_ref.fig9 import FIG9_TOKENS, fig9_variants  # noqa: E402
from tools.trace_ref.kvsim import KVSIM_BLOCKS, run_kvcache_simulator  # noqa: E402
from tools.trace_ref.policies import fifo, infinite, leaf_lru  # noqa: E402
from tools.trace_ref.readers import (  # noqa: E402
    azure_rows,
    flat_requests,
    kvtester_conversations,
    load_mooncake,
)
from tools.trace_ref.stats import summary, utilization  # noqa: E402
from tools.trace_ref.trie import MOONCAKE_BLOCK, BlockTrace  # noqa: E402

# The simulator names callers reach through this module (the tests load it by path).
__all__ = [
    "BlockTrace",
    "fifo",
    "infinite",
    "leaf_lru",
    "main",
    "vllm_free_queue",
]


def run_mooncake(args: argparse.Namespace) -> dict[str, Any]:
    trace = load_mooncake(Path(args.trace))
    result: dict[str, Any] = {
        "trace": Path(args.trace).name,
        "definition": "longest contiguous cached prefix; 512-token hash blocks, last block partial; "
        "capacity = floor(tokens / 512) blocks; leaf-only LRU with the matched path pinned",
        "requests": len(trace.nodes),
        "unique_blocks": len(trace.parent) - 1,
        "infinite": {},
        "lru_by_tokens": {},
    }
    for warmup in (0.0, 0.5):
        result["infinite"][f"warmup={warmup}"] = infinite(trace, warmup).as_dict()
    for tokens in FIG9_TOKENS:
        blocks = tokens // MOONCAKE_BLOCK
        row = {}
        for warmup in (0.0, 0.5):
            row[f"lru warmup={warmup}"] = leaf_lru(trace, blocks, warmup).as_dict()
            row[f"fifo warmup={warmup}"] = fifo(trace, blocks, warmup).as_dict()
        result["lru_by_tokens"][str(tokens)] = row
    return result


def run_fig9(args: argparse.Namespace) -> dict[str, Any]:
    trace = load_mooncake(Path(args.trace))
    result = fig9_variants(trace)
    result["trace"] = Path(args.trace).name
    result["definition"] = (
        "candidate definitions of FAST'25 Fig. 9 (see fig9_variants); fig9 values read off the "
        "figure (about +-0.01)"
    )
    return result


def run_kvsim(args: argparse.Namespace) -> dict[str, Any]:
    """Our fifo/lru at kvcache-simulator semantics next to kvcache-simulator's own numbers."""
    trace = load_mooncake(Path(args.trace))
    ours = {
        "ceiling": infinite(trace, 0.5).as_dict(),
        "points": [
            {
                "fifo": fifo(trace, blocks, 0.5, require_full=True).as_dict(),
                "lru": leaf_lru(trace, blocks, 0.5, require_full=True).as_dict(),
            }
            for blocks in KVSIM_BLOCKS
        ],
    }
    result: dict[str, Any] = {
        "trace": Path(args.trace).name,
        "definition": "warmup 50% of requests (file order); token-weighted longest contiguous prefix; "
        "capacity in 512-token blocks",
        "capacities_blocks": list(KVSIM_BLOCKS),
        "ours": ours,
    }
    if args.kvsim_python:
        result["kvcache_simulator"] = run_kvcache_simulator(args.kvsim_python, args.trace, KVSIM_BLOCKS)
    return result


def run_kvtester(args: argparse.Namespace) -> dict[str, Any]:
    """Per-conversation infinite-cache hit rate (token-weighted over the conversation)."""
    names = ("infinite", "previous_request_only", "top_level_only", "infinite_hashed_blocks_only")
    rates: dict[str, list[float]] = {name: [] for name in names}
    all_hit = all_total = requests = 0
    for document in kvtester_conversations(Path(args.trace)):
        block = document.get("block_size", 64)
        ordered = sorted(flat_requests(document["requests"]), key=lambda pair: pair[0])
        variants = {
            "infinite": [entry for _, entry in ordered],
            "previous_request_only": [entry for _, entry in ordered],
            "top_level_only": [e for e in document["requests"] if e["type"] != "subagent"],
            "infinite_hashed_blocks_only": [entry for _, entry in ordered],
        }
        for name, entries in variants.items():
            seen: set[int] = set()
            previous: list[int] = []
            hit = total = 0
            for entry in entries:
                ids = entry["hash_ids"]
                matched = 0
                if name == "previous_request_only":
                    while matched < min(len(ids), len(previous)) and ids[matched] == previous[matched]:
                        matched += 1
                    previous = ids
                else:
                    while matched < len(ids) and ids[matched] in seen:
                        matched += 1
                    seen.update(ids)
                hit += block * matched
                total += block * len(ids) if name == "infinite_hashed_blocks_only" else entry["in"]
            rates[name].append(hit / total)
            if name == "infinite":
                all_hit += hit
                all_total += total
                requests += len(entries)
    return {
        "trace": Path(args.trace).name,
        "definition": "per conversation: sum over its requests of 64 * (longest cached block prefix) / "
        "sum of input tokens (the uncovered tail counts as a miss; infinite_hashed_blocks_only "
        "leaves the tail out); no warm system prefix; previous_request_only matches against the "
        "previous request in arrival order only; "
        "percentiles by linear interpolation",
        "conversations": len(rates["infinite"]),
        "requests": requests,
        "pooled_hit_rate_tokens": all_hit / all_total,
        "per_conversation": {name: summary(values) for name, values in rates.items()},
        "readme_conversation_only": {
            "min": 0.61,
            "p25": 0.92,
            "median": 0.96,
            "p75": 0.97,
            "max": 1.0,
            "mean": 0.93,
        },
    }


def run_azure(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {
        "definition": "slot-steps summed over every decode step of every request (one slot = one token "
        "of KV); reserve-max reserves prompt + the trace's largest output; paged block size 16",
        "files": {},
    }
    for name in args.trace_files:
        rows = list(azure_rows(Path(name)))
        prompts = [p for p, _ in rows]
        outputs = [o for _, o in rows]
        out["files"][Path(name).name] = {
            "requests": len(rows),
            "prompt": summary([float(p) for p in prompts]),
            "output": summary([float(o) for o in outputs]),
            "utilization": utilization(rows, 16, max(outputs)),
            "max_output": max(outputs),
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    commands = (
        ("mooncake", run_mooncake),
        ("kvsim", run_kvsim),
        ("kvtester", run_kvtester),
        ("fig9", run_fig9),
    )
    for name, func in commands:
        command = sub.add_parser(name)
        command.add_argument("trace")
        command.add_argument("--out")
        command.set_defaults(func=func)
        if name == "kvsim":
            command.add_argument("--kvsim-python", help="python of a venv with kvcache-simulator installed")
    azure = sub.add_parser("azure")
    azure.add_argument("trace_files", nargs="+")
    azure.add_argument("--out")
    azure.set_defaults(func=run_azure)
    args = parser.parse_args(argv)
    result = args.func(args)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
