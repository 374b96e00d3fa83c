"""How SGLang 0.5.23 splits a memory budget between a hybrid's pools, and the batch that fits.

Pure integer arithmetic (ratios as exact fractions of their decimal text).
The budget is what SGLang calls ``total_rest_memory`` / ``available_bytes``:
memory for KV and states after weights and activations.  SGLang's rules
(``sglang/srt/mem_cache/kv_cache_configurator.py`` ``_handle_max_mamba_cache``,
``sglang/srt/model_executor/pool_configurator.py`` ``HybridSWAPoolConfigurator``
and ``compute_swa_request_cap``), page size 1, no speculative decoding:

1. Mamba (when the model has Mamba layers): ``budget * r / (1 + r)`` goes to
   states, ``r = mamba_full_memory_ratio`` (default 0.9); ``slots =
   (that - state) // state``; ``(slots + 1) * state`` bytes are taken (slot 0
   pads).  Running requests are capped at ``slots // 5`` (3 per request plus
   the 2 ping-pong track slots of the default extra buffer).
2. SWA (when the model has SWA layers): ``cell = full_bytes + ratio *
   swa_bytes`` per token, ``full_tokens = rest // cell``, ``swa_tokens =
   full_tokens * ratio``, ``ratio = swa_full_tokens_ratio`` (default 0.8).
   Otherwise ``full_tokens = rest // full_bytes``.

The batch that fits at request length ``L`` is the smallest of the pools'
limits: ``full_tokens // L``, ``swa_tokens // min(L, W + 128 + 2)`` (the window,
the 128-token eviction interval, a page and a decode page: SGLang's per-request
SWA need) and the Mamba cap.  ``need_batch`` is the same count without fixed
pools: every request takes what it needs (``L`` full tokens, ``min(L, W)`` SWA
tokens, one state) from one budget, which is what a shared pool such as
vLLM 0.33's approaches.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

import attrs

from kvstate.simulate.models import HybridLayout

SWA_FULL_TOKENS_RATIO = "0.8"
MAMBA_FULL_MEMORY_RATIO = "0.9"
SWA_EVICTION_INTERVAL = 128
MAMBA_SLOTS_PER_RUNNING = 5  # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO 3 + 2 track slots
MAMBA_SLOTS_HELD = 3  # a running request's state plus its two ping-pong track slots
MAX_MAMBA_RATIO = Fraction(100)  # --mamba-full-memory-ratio: states at most 100/101 of the budget
_DECIMAL = re.compile(r"^\s*(?=[0-9.]{1,13}\s*$)[0-9]*\.?[0-9]+\s*$")


def ratio(text: str | float, name: str, *, high: Fraction = Fraction(1)) -> Fraction:
    """``text`` (a plain decimal such as ``0.8``) as an exact fraction in (0, high];
    ``ValueError`` otherwise.  No exponents, at most 12 digits: the value stays small."""
    if not _DECIMAL.match(str(text)):
        raise ValueError(f"{name} must be a decimal number like 0.8, got {str(text)[:40]!r}")
    value = Fraction(str(text))
    if value <= 0 or value > high:
        raise ValueError(f"{name} must be in (0, {high}], got {text}")
    return value


@attrs.frozen
class Pools:
    """What one budget buys: the full-attention baseline and the hybrid's SGLang pools."""

    memory_bytes: int
    fa_tokens: int  # every layer treated as full attention
    full_tokens: int  # the hybrid's full-attention pool
    swa_tokens: int  # its SWA pool (0 without SWA layers)
    mamba_slots: int  # its Mamba state slots (0 without Mamba layers)
    mamba_bytes: int  # bytes the Mamba slots take, padding slot included
    max_running: int | None  # SGLang's cap on running requests from the Mamba slots

    @property
    def fits(self) -> bool:
        return self.full_tokens > 0 and (self.mamba_bytes == 0 or self.mamba_slots > 0)

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


def size_pools(layout: HybridLayout, memory_bytes: int, *, swa_ratio: Fraction,
               mamba_ratio: Fraction) -> Pools:
    """SGLang 0.5.23's split of ``memory_bytes`` for ``layout`` (see the module docstring)."""
    if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int) or memory_bytes < 1:
        raise ValueError(f"memory must be a positive number of bytes, got {memory_bytes!r}")
    fa_tokens = memory_bytes // layout.fa_bytes_per_token
    rest, slots, mamba_bytes, cap = memory_bytes, 0, 0, None
    if layout.mamba_layers:
        state = layout.state_bytes
        budget = memory_bytes * mamba_ratio / (1 + mamba_ratio)
        slots = max(0, int((budget - state) // state))
        mamba_bytes = (slots + 1) * state
        rest = max(0, memory_bytes - mamba_bytes)
        cap = slots // MAMBA_SLOTS_PER_RUNNING
    if layout.swa_layers:
        cell = layout.full_bytes_per_token + swa_ratio * layout.swa_bytes_per_token
        full_tokens = int(rest // cell)
        swa_tokens = int(full_tokens * swa_ratio)
    else:
        full_tokens, swa_tokens = rest // layout.full_bytes_per_token, 0
    return Pools(memory_bytes, fa_tokens, full_tokens, swa_tokens, slots, mamba_bytes, cap)


def swa_need(layout: HybridLayout, length: int) -> int:
    """SWA tokens one running request of ``length`` tokens holds in SGLang's pool."""
    assert layout.window is not None
    return min(length, layout.window + SWA_EVICTION_INTERVAL + 2)


def sglang_batch(layout: HybridLayout, pools: Pools, length: int) -> int:
    """Concurrent requests of ``length`` tokens that SGLang's pools hold at once."""
    limits = [pools.full_tokens // length]
    if layout.swa_layers:
        limits.append(pools.swa_tokens // swa_need(layout, length))
    if pools.max_running is not None:
        limits.append(pools.max_running)
    return max(0, min(limits))


def need_batch(layout: HybridLayout, memory_bytes: int, length: int) -> int:
    """Concurrent requests of ``length`` tokens if each took only what it needs from one budget."""
    window = min(length, layout.window or 0)
    per_request = (length * layout.full_bytes_per_token + window * layout.swa_bytes_per_token
                   + layout.state_bytes)
    return memory_bytes // per_request


def fa_batch(pools: Pools, length: int) -> int:
    return pools.fa_tokens // length


def batch_table(layout: HybridLayout, pools: Pools, length: int) -> dict[str, int]:
    return {"length": length, "full_attention": fa_batch(pools, length),
            "hybrid_sglang": sglang_batch(layout, pools, length),
            "hybrid_need": need_batch(layout, pools.memory_bytes, length)}


__all__ = ["MAMBA_FULL_MEMORY_RATIO", "MAMBA_SLOTS_HELD", "MAMBA_SLOTS_PER_RUNNING", "MAX_MAMBA_RATIO",
           "Pools", "SWA_EVICTION_INTERVAL", "SWA_FULL_TOKENS_RATIO", "batch_table", "fa_batch",
           "need_batch", "ratio", "sglang_batch", "size_pools", "swa_need"]
