"""A ``ModelReport`` as text (a block per layout and budget) and as one ``--json`` record.

Every record carries the definitions its numbers depend on (the pool rule,
the runs, the measurement), so a number is never separated from what it
means.  Pure formatting: reads the report, returns new strings and dicts.
"""

from __future__ import annotations

from typing import Any

from kvstate.simulate.hybrid_pools import SWA_EVICTION_INTERVAL
from kvstate.simulate.hybrid_report import RUNS, ModelReport

RUN_LABELS = {
    "full_attention": "as full attention",
    "hybrid_full_rule": "hybrid pools, full-attention rule",
    "hybrid": "hybrid, SGLang 0.5.23 rules",
}

DEFINITION = (
    "pools: SGLang 0.5.23's split of the budget (Mamba states first: budget * r / (1 + r), "
    "r = mamba_full_memory_ratio; then full = rest // (full + ratio * swa bytes per token), "
    "swa = full * ratio, ratio = swa_full_tokens_ratio); full attention: every sequence-mixing "
    "layer keeps KV for every token; batch: concurrent requests of the median and p90 "
    "prompt + output length (SGLang pools: min(full // L, swa // min(L, W + "
    f"{SWA_EVICTION_INTERVAL} + 2), Mamba slots // 5); need: budget // (L * full + min(L, W) * "
    "swa bytes + one state)); runs: SGLang 0.5.23's UnifiedRadixCache flows on the kvstate core, "
    "one request at a time in stream order, pages of 64 tokens, match limited to the prompt minus "
    "its last page, prompt and output cached at finish, chunked prefill of 8192 tokens with Mamba; "
    "full-attention rule: the same flows with no window binding; hit rate: token-weighted "
    "longest cached prefix at admission; full reach: the cached prefix the full layers alone "
    "would allow in the same hybrid run"
)


def gib(value: int) -> str:
    return f"{value / (1 << 30):,.1f} GiB"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def to_json(report: ModelReport) -> dict[str, Any]:
    """The ``--json`` record of one layout at one budget (a new dict)."""
    layout, pools = report.layout, report.pools
    runs = {run: (None if result is None else result.to_json())
            for run, result in report.results.items()}
    return {
        "trace": report.shape.name,
        "requests": report.shape.requests,
        "memory_bytes": pools.memory_bytes,
        "model": layout.to_json(),
        "kv_bytes_per_token": {
            "full_attention": layout.fa_bytes_per_token,
            "hybrid_full_layers": layout.full_bytes_per_token,
            "hybrid_swa_layers": layout.swa_bytes_per_token,
            "state_bytes_per_request": layout.state_bytes,
        },
        "pools": {**pools.to_json(), "swa_full_tokens_ratio": float(report.options.swa_ratio),
                  "mamba_full_memory_ratio": float(report.options.mamba_ratio)},
        "batch": [{"which": which, **row} for which, row in zip(("median", "p90"), report.batches,
                                                                 strict=True)],
        "hit_rate": {**{run: report.hit_rate(run) for run in RUNS},
                     "hybrid_full_reach": report.reach_rate},
        "not_run": dict(report.not_run),
        "runs": runs,
        "unit_tokens": report.shape.unit,
        "definition": DEFINITION,
    }


def text_lines(report: ModelReport) -> list[str]:
    """The text block of one layout at one budget."""
    layout, pools, shape = report.layout, report.pools, report.shape
    lines = [f"{layout.name}: {layout.describe()}",
             f"  memory {gib(pools.memory_bytes)} ({pools.memory_bytes:,} B) on {shape.name} "
             f"({shape.requests:,} requests)"]
    extra = []
    if layout.swa_layers:
        extra.append(f"+ {layout.swa_bytes_per_token:,} per windowed token")
    if layout.mamba_layers:
        extra.append(f"+ {layout.state_bytes:,} state per request")
    lines.append(f"  KV bytes/token   full-attention equivalent {layout.fa_bytes_per_token:,} | "
                 f"hybrid {layout.full_bytes_per_token:,} per cached token {' '.join(extra)}".rstrip())
    pool = [f"full {pools.full_tokens:,} tokens"]
    if layout.swa_layers:
        pool.append(f"SWA {pools.swa_tokens:,} tokens (ratio {float(report.options.swa_ratio):g})")
    if layout.mamba_layers:
        pool.append(f"{pools.mamba_slots:,} Mamba slots ({gib(pools.mamba_bytes)}), "
                    f"at most {pools.max_running:,} running")
    lines.append(f"  pools            as full attention {pools.fa_tokens:,} tokens | "
                 f"SGLang 0.5.23: {', '.join(pool)}")
    for index, (which, row) in enumerate(zip(("median", "p90"), report.batches, strict=True)):
        head = "  largest batch    " if index == 0 else " " * 19
        lines.append(f"{head}{which} {row['length']:,} tokens: full attention {row['full_attention']:,}, "
                     f"hybrid {row['hybrid_sglang']:,} (SGLang pools), {row['hybrid_need']:,} "
                     "(per-request need)")
    rates = [f"{RUN_LABELS[run]} {_rate(report.hit_rate(run))}" for run in RUNS
             if run != "hybrid" or layout.is_hybrid]
    if report.reach_rate is not None:
        rates[-1] += f" (full-layer reach {report.reach_rate:.4f})"
    lines.append(f"  hit rate         {' | '.join(rates)}")
    for run, why in report.not_run.items():
        if run != "hybrid" or layout.is_hybrid:
            lines.append(f"  not run          {RUN_LABELS[run]}: {why}")
    return lines


__all__ = ["DEFINITION", "RUN_LABELS", "gib", "text_lines", "to_json"]
