"""Argument checks of the seed-002 API (pure; raise ``TypeError``/``ValueError``, change nothing)."""

from __future__ import annotations

from typing import Any

from kvstate.config import ModelConfig


def check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def model_config(config: Any) -> ModelConfig:
    if isinstance(config, ModelConfig):
        return config
    try:  # a seed-style dataclass with the same fields
        return ModelConfig(config.num_layers, config.num_kv_heads, config.head_dim,
                           getattr(config, "dtype_bytes", 2), getattr(config, "v_head_dim", None))
    except AttributeError as exc:
        raise TypeError(f"config must be a kvstate.ModelConfig, got {type(config).__name__}") from exc


def check_layer(layer: object, num_layers: int) -> int:
    """A layer index in ``0..num_layers - 1`` (bool is not an int here)."""
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise TypeError(f"layer must be an int, got {type(layer).__name__} {layer!r}")
    if not 0 <= layer < num_layers:
        raise ValueError(f"layer {layer} is outside 0..{num_layers - 1}")
    return layer
