"""Every FAST'25 Fig. 9 candidate definition at the figure's capacities.

``fig9_variants`` reads the trace (it does not mutate it), builds the derived
traces it needs, and returns a new JSON-ready dict; it prints one progress
line per variant to stderr.
"""

from __future__ import annotations

import math
import statistics
import sys
from typing import Any

from .candidates import flat_lru, leaf_lru_general, vllm_free_queue
from .policies import leaf_lru
from .reshape import block_costs, output_blocks, split_blocks, with_private_outputs
from .trie import MOONCAKE_BLOCK, BlockTrace

FIG9_TOKENS = (
    10_000,
    100_000,
    1_000_000,
    2_000_000,
    3_000_000,
    5_000_000,
    10_000_000,
    50_000_000,
    100_000_000,
)

FIG9_PUBLISHED = (0.045, 0.073, 0.087, 0.12, 0.17, 0.25, 0.326, 0.40, 0.40)


def fig9_variants(trace: BlockTrace) -> dict[str, Any]:
    """Every candidate definition at the Fig. 9 capacities: hit rates and error against the figure."""
    block = MOONCAKE_BLOCK
    cost = block_costs(trace)
    halves = split_blocks(trace, 256)
    half_cost = block_costs(halves)
    outputs = output_blocks(trace, block)
    private, measured = with_private_outputs(trace, block)
    runs: dict[str, Any] = {
        "lru (baseline: whole trace, token-weighted)": lambda t: leaf_lru(trace, t // block),
        "lru, per-request mean": lambda t: leaf_lru(trace, t // block),
        "lru, last 50%": lambda t: leaf_lru(trace, t // block, 0.5),
        "lru, last 50%, per-request mean": lambda t: leaf_lru(trace, t // block, 0.5),
        "lru, block-weighted": lambda t: leaf_lru(trace, t // block),
        "lru, capacity charged by tokens": lambda t: leaf_lru_general(trace, t, cost=cost),
        "lru, 256-token blocks": lambda t: leaf_lru(halves, t // 256),
        "lru, 256-token blocks charged by tokens": lambda t: leaf_lru_general(halves, t, cost=half_cost),
        "lru, outputs take room while running": lambda t: leaf_lru_general(
            trace, t // block, reserve=outputs
        ),
        "lru, outputs cached": lambda t: leaf_lru_general(private, t // block, measured=measured),
        "vllm free queue": lambda t: vllm_free_queue(trace, t // block),
        "flat block LRU, prefix hits": lambda t: flat_lru(trace, t // block),
        "flat block LRU, any-position hits": lambda t: flat_lru(trace, t // block, any_position=True),
        "lru, capacity x2 (tokens / 256 slots of 512)": lambda t: leaf_lru(trace, t // 256),
        "lru, capacity x2, last 50%": lambda t: leaf_lru(trace, t // 256, 0.5),
        "vllm free queue, last 50%": lambda t: vllm_free_queue(trace, t // block, 0.5),
        "lru, 256-token blocks, last 50%": lambda t: leaf_lru(halves, t // 256, 0.5),
    }
    out: dict[str, Any] = {"capacities_tokens": list(FIG9_TOKENS), "fig9": list(FIG9_PUBLISHED)}
    out["variants"] = {}
    for name, run in runs.items():
        values = []
        for tokens in FIG9_TOKENS:
            outcome = run(tokens)
            if "per-request mean" in name:
                values.append(outcome.mean_request_hit)
            elif "block-weighted" in name:
                values.append(outcome.hit_rate_blocks)
            else:
                values.append(outcome.hit_rate_tokens)
        errors = [value - published for value, published in zip(values, FIG9_PUBLISHED, strict=True)]
        mid = errors[1:6]  # 1e5 .. 5e6 tokens
        out["variants"][name] = {
            "values": values,
            "error": errors,
            "rms_error": math.sqrt(statistics.fmean(e * e for e in errors)),
            "rms_error_1e5_5e6": math.sqrt(statistics.fmean(e * e for e in mid)),
        }
        print(f"{name}: " + " ".join(f"{v:.4f}" for v in values), file=sys.stderr, flush=True)
    return out
