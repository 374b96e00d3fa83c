"""Shared test fixtures for trace simulation: small prefix-chained traces and the reference tool."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from typing import Any

from kvstate.traces import TraceRequest

BLOCK = 4


@functools.cache
def reference_simulator() -> Any:
    """Load tools/trace_hit_rates.py by path, as `python tools/trace_hit_rates.py` runs it.

    Loaded once per test session; its simulators keep no state between calls.
    """
    path = Path(__file__).resolve().parents[1] / "tools" / "trace_hit_rates.py"
    spec = importlib.util.spec_from_file_location("trace_hit_rates", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def reference_trace(requests: list[TraceRequest]) -> tuple[Any, Any]:
    """The reference simulator and its ``BlockTrace`` of ``requests`` (block keys and token counts)."""
    sim = reference_simulator()
    trace = sim.BlockTrace()
    for request in requests:
        trace.add(list(request.block_keys), list(request.block_token_counts))
    return sim, trace


def chain_requests(
    prompts: list[tuple[list[int], int]], outputs: int = 0, block: int = BLOCK
) -> list[TraceRequest]:
    """Each prompt is (trie path of child indices, tokens of the last block).

    A block's key is its trie position, so equal keys mean equal prefixes; a
    partial last block gets a key of its own that depends on its length (as in
    Mooncake).
    """
    out = []
    for index, (path, tail) in enumerate(prompts):
        keys, node = [], 0
        for step in path:
            node = node * 3 + step + 1
            keys.append(node)
        counts = [block] * (len(keys) - 1) + [tail]
        if tail < block:
            keys[-1] = 1_000_000 + keys[-1] * block + tail
        out.append(
            TraceRequest(
                request_id=f"r{index}",
                sequence=index,
                arrival_s=float(index),
                prompt_length=sum(counts),
                output_length=outputs,
                source="fixture",
                block_size=block,
                block_keys=tuple(keys),
                block_token_counts=tuple(counts),
            )
        )
    return out
