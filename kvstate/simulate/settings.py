"""What one simulation run measures, and what it reports.

``SimulationSettings`` is the run's configuration and ``SimulationResult``
its outcome; both are frozen values.  ``SimulationResult.definition`` spells
out the measurement (window, weighting, block size) and goes into every
result file, so a number is never separated from what it means.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

Granularity = Literal["block", "token"]
EvictionUnit = Literal["node", "page"]


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name} must be a positive integer, got {value!r}")


def check_batching(max_running: int | None, step_ms: float) -> None:
    """``max_running`` is ``None`` or a positive int; with batching, ``step_ms`` must be > 0.

    The one check of the batching parameters (``SimulationSettings`` and
    ``batching.BatchingSimulator`` both call it); raises ``ValueError``.
    """
    if max_running is None:
        return
    if isinstance(max_running, bool) or not isinstance(max_running, int) or max_running < 1:
        raise ValueError(f"max_running must be a positive integer, got {max_running!r}")
    if not step_ms > 0:
        raise ValueError(f"step_ms must be > 0, got {step_ms}")


def _fraction(instance: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{attribute.name} must be in [0, 1), got {value!r}")


@attrs.frozen
class SimulationSettings:
    """One capacity point of a simulation.

    Attributes:
        capacity_tokens: KV pool size in tokens.
        policy: eviction policy name (``lru``, ``fifo``, ``lfu``, ``module:Class``, or
            ``vllm``: vLLM's free-queue LRU, run by ``kvstate.simulate.vllm_driver``).
        warmup: fraction of requests (in stream order) that warm the cache unmeasured.
        granularity: ``block`` maps each trace hash block to one page (fast, and
            the hash-block semantics of kvcache-simulator); ``token`` drives the
            synthetic token ids with pages of ``page_size`` tokens.
        page_size: tokens per page in ``token`` granularity (ignored for ``block``).
        eviction_unit: ``node`` evicts whole radix nodes (SGLang); ``page``
            splits every cached node into one-page nodes so eviction frees a
            single page at a time (a per-block trie, as kvcache-simulator).
        cache_output: cache the generated tokens at finish (they never match,
            since the trace does not say what they were, but they take room).
        decode: allocate the output tokens before finishing.  ``False`` models a
            prefill-only cache (kvcache-simulator's semantics: only prompt
            blocks ever occupy the pool).
        max_running: ``None`` runs requests one at a time in stream order;
            a number replays arrival times with continuous batching, at most
            that many requests at once (``kvstate.simulate.batching``).
        step_ms: duration of one decode iteration under batching (a model
            parameter; the traces do not record engine speed); must be > 0
            when ``max_running`` is set (unused otherwise).
    """

    capacity_tokens: int = attrs.field(validator=_positive)
    policy: str = "lru"
    warmup: float = attrs.field(default=0.0, validator=_fraction)
    granularity: Granularity = "block"
    page_size: int = attrs.field(default=16, validator=_positive)
    eviction_unit: EvictionUnit = "node"
    cache_output: bool = False
    decode: bool = True
    max_running: int | None = None
    step_ms: float = 20.0

    def __attrs_post_init__(self) -> None:
        check_batching(self.max_running, self.step_ms)


@attrs.frozen
class SimulationResult:
    """Counters of one run; rates are derived.  ``definition`` says how they were measured."""

    settings: SimulationSettings
    trace: str
    unit_tokens: int  # tokens per page (block granularity: the trace's block size)
    capacity_pages: int
    requests: int
    measured_requests: int
    hit_tokens: int
    total_tokens: int
    hit_blocks: int
    total_blocks: int
    evicted_pages: int
    peak_pages: int
    rejected_requests: int  # did not fit even with everything evictable gone
    retracted_requests: int  # ran out of room while decoding; finished early
    waited_requests: int  # had to wait for room before admission (batching only)
    underfilled: bool  # the pool never filled before the measurement window

    @property
    def hit_rate_tokens(self) -> float:
        return self.hit_tokens / self.total_tokens if self.total_tokens else 0.0

    @property
    def hit_rate_blocks(self) -> float:
        return self.hit_blocks / self.total_blocks if self.total_blocks else 0.0

    @property
    def definition(self) -> str:
        s = self.settings
        unit = "trace hash block" if s.granularity == "block" else f"page of {self.unit_tokens} tokens"
        schedule = (
            "one request at a time in stream order"
            if s.max_running is None
            else f"continuous batching over arrival times, max_running {s.max_running}, "
            f"decode step {s.step_ms} ms"
        )
        if s.policy == "vllm":
            caching = (
                "vllm: vLLM V1 free-queue LRU on the block-mode core; only full blocks are cached "
                "(full output blocks too, under private keys), the last prompt token is always "
                f"recomputed; outputs decoded: {s.decode}"
            )
        else:
            caching = (
                f"eviction unit: {s.eviction_unit}; outputs decoded: {s.decode}; "
                f"outputs cached: {s.cache_output}"
            )
        return (
            f"window: requests after the first floor({s.warmup} * n) in stream order; "
            f"schedule: {schedule}; "
            "hit: longest contiguous cached prefix, looked up at admission; "
            f"weighting: tokens (hit_rate_tokens) and {unit}s (hit_rate_blocks); "
            f"block size {self.unit_tokens} tokens; capacity {self.capacity_pages} pages; {caching}"
        )

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` record (one per capacity); a new dict, nothing shared."""
        s = self.settings
        return {
            "trace": self.trace,
            "capacity_tokens": s.capacity_tokens,
            "capacity_pages": self.capacity_pages,
            "policy": s.policy,
            "warmup": s.warmup,
            "granularity": s.granularity,
            "block_size": self.unit_tokens,
            "eviction_unit": s.eviction_unit,
            "cache_output": s.cache_output,
            "decode": s.decode,
            "requests": self.requests,
            "measured_requests": self.measured_requests,
            "hit_rate_tokens": self.hit_rate_tokens,
            "hit_rate_blocks": self.hit_rate_blocks,
            "hit_tokens": self.hit_tokens,
            "total_tokens": self.total_tokens,
            "hit_blocks": self.hit_blocks,
            "total_blocks": self.total_blocks,
            "evicted_blocks": self.evicted_pages,
            "peak_pages": self.peak_pages,
            "rejected_requests": self.rejected_requests,
            "retracted_requests": self.retracted_requests,
            "waited_requests": self.waited_requests,
            "max_running": s.max_running,
            "step_ms": s.step_ms,
            "underfilled": self.underfilled,
            "definition": self.definition,
        }
