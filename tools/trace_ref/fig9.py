"""Every FAST'25 Fig. 9 candidate definition at the figure's capacities.

``fig9_variants`` reads the trace (it does not mutate it), builds the derived
traces it needs, runs each distinct simulation once per capacity, and returns
a new JSON-ready dict; it prints one progress line per variant to stderr.
"""

from __future__ import annotations

import functools
import math
import statistics
import sys
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from .candidates import flat_lru, vllm_free_queue
from .policies import leaf_lru
from .reshape import block_costs, output_blocks, split_blocks, with_private_outputs
from .trie import MOONCAKE_BLOCK, BlockTrace, Outcome

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


# Which number of a run a variant reports.
TOKEN_WEIGHTED = attrgetter("hit_rate_tokens")
BLOCK_WEIGHTED = attrgetter("hit_rate_blocks")
PER_REQUEST_MEAN = attrgetter("mean_request_hit")


def fig9_variants(trace: BlockTrace) -> dict[str, Any]:
    """Every candidate definition at the Fig. 9 capacities: hit rates and error against the figure.

    A variant is a simulation run (a cache model at a capacity in tokens) and
    the metric it reports; variants that differ only in the metric share one
    run per capacity.
    """
    block = MOONCAKE_BLOCK
    cost = block_costs(trace)
    halves = split_blocks(trace, 256)
    half_cost = block_costs(halves)
    outputs = output_blocks(trace, block)
    private, measured = with_private_outputs(trace, block)
    runs: dict[str, Callable[[int], Outcome]] = {
        "lru": lambda t: leaf_lru(trace, t // block),
        "lru, last 50%": lambda t: leaf_lru(trace, t // block, 0.5),
        "lru, token cost": lambda t: leaf_lru(trace, t, cost=cost),
        "lru, 256-token blocks": lambda t: leaf_lru(halves, t // 256),
        "lru, 256-token blocks, token cost": lambda t: leaf_lru(halves, t, cost=half_cost),
        "lru, output reserve": lambda t: leaf_lru(trace, t // block, reserve=outputs),
        "lru, private outputs": lambda t: leaf_lru(private, t // block, measured=measured),
        "vllm free queue": lambda t: vllm_free_queue(trace, t // block),
        "flat lru": lambda t: flat_lru(trace, t // block),
        "flat lru, any position": lambda t: flat_lru(trace, t // block, any_position=True),
        "lru, capacity x2": lambda t: leaf_lru(trace, t // 256),
        "lru, capacity x2, last 50%": lambda t: leaf_lru(trace, t // 256, 0.5),
        "vllm free queue, last 50%": lambda t: vllm_free_queue(trace, t // block, 0.5),
        "lru, 256-token blocks, last 50%": lambda t: leaf_lru(halves, t // 256, 0.5),
    }
    variants: dict[str, tuple[str, Callable[[Outcome], float]]] = {
        "lru (baseline: whole trace, token-weighted)": ("lru", TOKEN_WEIGHTED),
        "lru, per-request mean": ("lru", PER_REQUEST_MEAN),
        "lru, last 50%": ("lru, last 50%", TOKEN_WEIGHTED),
        "lru, last 50%, per-request mean": ("lru, last 50%", PER_REQUEST_MEAN),
        "lru, block-weighted": ("lru", BLOCK_WEIGHTED),
        "lru, capacity charged by tokens": ("lru, token cost", TOKEN_WEIGHTED),
        "lru, 256-token blocks": ("lru, 256-token blocks", TOKEN_WEIGHTED),
        "lru, 256-token blocks charged by tokens": ("lru, 256-token blocks, token cost", TOKEN_WEIGHTED),
        "lru, outputs take room while running": ("lru, output reserve", TOKEN_WEIGHTED),
        "lru, outputs cached": ("lru, private outputs", TOKEN_WEIGHTED),
        "vllm free queue": ("vllm free queue", TOKEN_WEIGHTED),
        "flat block LRU, prefix hits": ("flat lru", TOKEN_WEIGHTED),
        "flat block LRU, any-position hits": ("flat lru, any position", TOKEN_WEIGHTED),
        "lru, capacity x2 (tokens / 256 slots of 512)": ("lru, capacity x2", TOKEN_WEIGHTED),
        "lru, capacity x2, last 50%": ("lru, capacity x2, last 50%", TOKEN_WEIGHTED),
        "vllm free queue, last 50%": ("vllm free queue, last 50%", TOKEN_WEIGHTED),
        "lru, 256-token blocks, last 50%": ("lru, 256-token blocks, last 50%", TOKEN_WEIGHTED),
    }

    @functools.cache
    def outcome(run: str, tokens: int) -> Outcome:
        return runs[run](tokens)

    out: dict[str, Any] = {"capacities_tokens": list(FIG9_TOKENS), "fig9": list(FIG9_PUBLISHED)}
    out["variants"] = {}
    for name, (run, metric) in variants.items():
        values = [metric(outcome(run, tokens)) for tokens in FIG9_TOKENS]
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
