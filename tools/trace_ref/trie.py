"""Trie-interned block traces and the hit-rate tallies every simulator shares.

``BlockTrace`` owns the request paths it interns (``add`` mutates it in place);
the simulators in sibling modules only read a trace.  ``Outcome`` is a plain
result record; ``_Tally`` is a per-run accumulator a simulator owns and
mutates, then turns into an ``Outcome``.  Nothing here imports ``kvstate``:
this package is an independent check on it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

MOONCAKE_BLOCK = 512


@dataclass
class BlockTrace:
    """Requests as trie-node sequences with per-block token counts (owned by the caller)."""

    nodes: list[list[int]] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    parent: list[int] = field(default_factory=lambda: [-1])  # node 0 is the root
    outputs: list[int] = field(default_factory=list)  # output tokens per request

    def add(self, hash_ids: Sequence[Any], token_counts: Sequence[int], output_tokens: int = 0) -> None:
        """Append one request; interns ``(parent, hash id)`` pairs into trie nodes."""
        path: list[int] = []
        here = 0
        for hash_id in hash_ids:
            key = (here, hash_id)
            node = self._edges.get(key)
            if node is None:
                node = len(self.parent)
                self._edges[key] = node
                self.parent.append(here)
            path.append(node)
            here = node
        self.nodes.append(path)
        self.tokens.append(list(token_counts))
        self.outputs.append(output_tokens)

    def __post_init__(self) -> None:
        self._edges: dict[tuple[int, Any], int] = {}


@dataclass
class Outcome:
    policy: str
    capacity_blocks: int | None
    warmup: float
    measured_requests: int
    hit_tokens: int
    total_tokens: int
    hit_blocks: int
    total_blocks: int
    mean_request_hit: float
    mean_request_hit_blocks: float
    evicted_blocks: int = 0
    underfilled: bool = False

    @property
    def hit_rate_tokens(self) -> float:
        return self.hit_tokens / self.total_tokens if self.total_tokens else 0.0

    @property
    def hit_rate_blocks(self) -> float:
        return self.hit_blocks / self.total_blocks if self.total_blocks else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["hit_rate_tokens"] = self.hit_rate_tokens
        out["hit_rate_blocks"] = self.hit_rate_blocks
        return out


class _Tally:
    def __init__(self, trace: BlockTrace, warmup: float) -> None:
        self.first = math.floor(len(trace.nodes) * warmup)
        self.hit_tokens = self.total_tokens = self.hit_blocks = self.total_blocks = 0
        self.fractions: list[float] = []
        self.block_fractions: list[float] = []

    def add(self, index: int, counts: list[int], matched: int) -> None:
        self.add_hits(index, counts, sum(counts[:matched]), matched)

    def add_hits(self, index: int, counts: list[int], hit: int, hit_blocks: int) -> None:
        if index < self.first:
            return
        total = sum(counts)
        self.hit_tokens += hit
        self.total_tokens += total
        self.hit_blocks += hit_blocks
        self.total_blocks += len(counts)
        self.fractions.append(hit / total if total else 0.0)
        self.block_fractions.append(hit_blocks / len(counts) if counts else 0.0)

    def outcome(self, policy: str, capacity: int | None, warmup: float, **extra: Any) -> Outcome:
        mean = statistics.fmean(self.fractions) if self.fractions else 0.0
        mean_blocks = statistics.fmean(self.block_fractions) if self.block_fractions else 0.0
        return Outcome(
            policy,
            capacity,
            warmup,
            len(self.fractions),
            self.hit_tokens,
            self.total_tokens,
            self.hit_blocks,
            self.total_blocks,
            mean,
            mean_blocks,
            **extra,
        )
