"""Validation and conversion of the seed-002 API's key / value vectors.

Pure helpers for ``KVCacheManager``: they read the caller's lists (or
tensors), never mutate them, and return new float64 CPU tensors for the
``ValueStore``.  Bad input raises ``TypeError`` / ``ValueError`` before any
event is committed, so a rejected call changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvstate.config import ModelConfig


def kv_vector(name: str, values: Sequence[float], width: int) -> torch.Tensor:
    """``values`` as a new flat float64 tensor of ``width`` entries (``name`` is ``key`` or ``value``)."""
    try:
        length = len(values)
    except TypeError:
        raise TypeError(f"{name} must be a list of floats, got {type(values).__name__}") from None
    if length != width:
        raise ValueError(f"{name} has {length} values; expected {width} "
                         f"(num_kv_heads * {'head_dim' if name == 'key' else 'v_head_dim'})")
    if isinstance(values, torch.Tensor):
        return values.detach().reshape(-1).to("cpu", torch.float64)
    try:
        return torch.tensor(list(values), dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"{name} must hold real numbers: {exc}") from None


def kv_vectors(config: ModelConfig, key: Sequence[float],
               value: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """One token's ``(key, value)`` for one layer, checked against ``config``'s head sizes."""
    heads = config.num_kv_heads
    return (kv_vector("key", key, heads * config.head_dim),
            kv_vector("value", value, heads * config.value_head_dim))
