"""Layer layouts of hybrid models: which layers keep per-token KV, which a window, which a state.

A ``HybridLayout`` is numbers only (frozen): how many layers attend fully,
through a sliding window, or carry a Mamba / linear-attention state; the KV
geometry of the attention layers; the per-request state of a Mamba layer.
``NAMED`` holds real models, each with the public source its numbers come
from (checked against the model's ``config.json``; docs/results.md, section
7, cites them).  ``kvstate.simulate.layout_parse`` reads custom layouts.
This module owns the numbers and nothing else: pool sizes are
``hybrid_pools``', runs ``hybrid_driver``'s.

Bytes follow ``kvstate.config.ModelConfig`` (K plus V, every KV head) and,
for Mamba layers, SGLang 0.5.23's ``Mamba2StateShape.create`` /
``mamba_cache_per_req``: a conv state of ``(intermediate + 2 * groups *
state_size) x (conv_kernel - 1)`` elements in the model dtype and an SSM
state of ``heads x head_dim x state_size`` elements in float32 (SGLang's
default ``mamba_ssm_dtype``).
"""

from __future__ import annotations

from typing import Any

import attrs

from kvstate.config import ModelConfig

FLA_CHUNK_SIZE = 64  # the Mamba chunk SGLang 0.5.23 assumes when the config names none


def mamba2_state_bytes(*, intermediate: int, groups: int, heads: int, head_dim: int,
                       state_size: int, conv_kernel: int, conv_bytes: int = 2,
                       ssm_bytes: int = 4) -> int:
    """One request's state of one Mamba2 / Gated DeltaNet layer (SGLang 0.5.23's
    ``Mamba2StateShape.create`` at tensor parallelism 1): conv plus SSM bytes."""
    conv = (intermediate + 2 * groups * state_size) * (conv_kernel - 1) * conv_bytes
    ssm = heads * head_dim * state_size * ssm_bytes
    return conv + ssm


def _count(name: str, low: int) -> Any:
    def check(instance: Any, attribute: attrs.Attribute[Any], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return check


@attrs.frozen
class HybridLayout:
    """A model's layers by kind and the bytes each kind keeps.

    Attributes:
        name: how the layout is called (``gpt-oss-20b``, ``custom``).
        full_layers: layers whose KV is kept for every cached token.
        swa_layers: sliding-window layers: KV of the last ``window`` tokens only.
        window: the sliding window in tokens (``None`` without SWA layers).
        mamba_layers: Mamba / linear-attention layers: one fixed state per sequence.
        kv_heads, head_dim, dtype_bytes: KV geometry of every attention layer.
        state_bytes_per_layer: one request's conv + SSM state of one Mamba layer.
        mamba_chunk: the model's Mamba chunk in tokens (SGLang's checkpoint grid).
        source: where the numbers come from.
        note: what the layout leaves out or how an engine treats the model.
    """

    name: str
    full_layers: int = attrs.field(validator=_count("full", 1))
    kv_heads: int = attrs.field(validator=_count("kv_heads", 1))
    head_dim: int = attrs.field(validator=_count("head_dim", 1))
    swa_layers: int = attrs.field(default=0, validator=_count("swa", 0))
    window: int | None = None
    mamba_layers: int = attrs.field(default=0, validator=_count("mamba", 0))
    state_bytes_per_layer: int = attrs.field(default=0, validator=_count("state_bytes", 0))
    dtype_bytes: int = attrs.field(default=2, validator=_count("dtype_bytes", 1))
    mamba_chunk: int = attrs.field(default=FLA_CHUNK_SIZE, validator=_count("mamba_chunk", 1))
    source: str = ""
    note: str = ""

    def __attrs_post_init__(self) -> None:
        if self.swa_layers and (self.window is None or self.window < 1):
            raise ValueError("swa layers need a window >= 1")
        if not self.swa_layers and self.window is not None:
            raise ValueError("a window needs swa layers")
        if self.mamba_layers and self.state_bytes_per_layer < 1:
            raise ValueError("mamba layers need state_bytes >= 1")
        if not self.mamba_layers and self.state_bytes_per_layer:
            raise ValueError("state_bytes needs mamba layers")

    # -- bytes -------------------------------------------------------------------------------
    @property
    def layer_bytes_per_token(self) -> int:
        """K plus V of one token in one attention layer."""
        return ModelConfig(1, self.kv_heads, self.head_dim, self.dtype_bytes).bytes_per_token

    @property
    def layers(self) -> int:
        """Sequence-mixing layers (attention, sliding window, Mamba)."""
        return self.full_layers + self.swa_layers + self.mamba_layers

    @property
    def fa_bytes_per_token(self) -> int:
        """KV bytes per token if every sequence-mixing layer attended fully."""
        return self.layers * self.layer_bytes_per_token

    @property
    def full_bytes_per_token(self) -> int:
        """KV bytes per cached token of the hybrid: its full-attention layers."""
        return self.full_layers * self.layer_bytes_per_token

    @property
    def swa_bytes_per_token(self) -> int:
        """KV bytes per windowed token: the sliding-window layers."""
        return self.swa_layers * self.layer_bytes_per_token

    @property
    def state_bytes(self) -> int:
        """One request's state over every Mamba layer (SGLang's ``mamba_cache_per_req``)."""
        return self.mamba_layers * self.state_bytes_per_layer

    @property
    def is_hybrid(self) -> bool:
        return bool(self.swa_layers or self.mamba_layers)

    def describe(self) -> str:
        parts = [f"{self.full_layers} full"]
        if self.swa_layers:
            parts.append(f"{self.swa_layers} sliding-window ({self.window} tokens)")
        if self.mamba_layers:
            parts.append(f"{self.mamba_layers} Mamba ({self.state_bytes_per_layer:,} B state each)")
        return (f"{' + '.join(parts)} layers; {self.kv_heads} KV heads x {self.head_dim}, "
                f"{self.dtype_bytes} B")

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "full_layers": self.full_layers, "swa_layers": self.swa_layers,
            "window": self.window, "mamba_layers": self.mamba_layers, "kv_heads": self.kv_heads,
            "head_dim": self.head_dim, "dtype_bytes": self.dtype_bytes,
            "state_bytes_per_layer": self.state_bytes_per_layer, "state_bytes": self.state_bytes,
            "mamba_chunk": self.mamba_chunk, "source": self.source, "note": self.note,
        }


QWEN3_NEXT_STATE = mamba2_state_bytes(intermediate=32 * 128, groups=16, heads=32, head_dim=128,
                                      state_size=128, conv_kernel=4)
NEMOTRON_H_STATE = mamba2_state_bytes(intermediate=128 * 64, groups=8, heads=128, head_dim=64,
                                      state_size=128, conv_kernel=4)

NAMED: dict[str, HybridLayout] = {
    layout.name: layout
    for layout in (
        HybridLayout(
            "gpt-oss-20b", full_layers=12, swa_layers=12, window=128, kv_heads=8, head_dim=64,
            source="huggingface.co/openai/gpt-oss-20b config.json: num_hidden_layers 24, layer_types "
                   "alternating sliding_attention / full_attention, sliding_window 128, "
                   "num_key_value_heads 8, head_dim 64, bf16",
        ),
        HybridLayout(
            "gemma-3-27b", full_layers=10, swa_layers=52, window=1024, kv_heads=16, head_dim=128,
            source="huggingface.co/google/gemma-3-27b-it config.json text_config: num_hidden_layers 62, "
                   "sliding_window_pattern 6 (5 local : 1 global), sliding_window 1024, "
                   "num_key_value_heads 16, head_dim 128, bf16",
            note="SGLang 0.5.23 runs Gemma 3 as full attention (disable_hybrid_swa_memory); "
                 "the hybrid rows are what its SWA pool would give",
        ),
        HybridLayout(
            "llama-4-scout", full_layers=12, swa_layers=36, window=8192, kv_heads=8, head_dim=128,
            source="huggingface.co/meta-llama/Llama-4-Scout-17B-16E-Instruct config.json text_config: "
                   "num_hidden_layers 48, every 4th layer global (no_rope_layers), the others chunked "
                   "with attention_chunk_size 8192, num_key_value_heads 8, head_dim 128, bf16",
            note="chunked attention reads at most the current 8192-token chunk; SGLang 0.5.23 "
                 "treats it as a window of attention_chunk_size, which bounds its memory and can "
                 "only understate hits",
        ),
        HybridLayout(
            "qwen3-next-80b-a3b", full_layers=12, mamba_layers=36, kv_heads=2, head_dim=256,
            state_bytes_per_layer=QWEN3_NEXT_STATE,
            source="huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct config.json: num_hidden_layers 48, "
                   "full_attention_interval 4 (36 Gated DeltaNet + 12 full), num_key_value_heads 2, "
                   "head_dim 256, linear_num_key_heads 16, linear_num_value_heads 32, "
                   "linear_key_head_dim 128, linear_value_head_dim 128, linear_conv_kernel_dim 4, bf16",
            note="no mamba_chunk_size in the config: SGLang uses FLA's chunk of 64",
        ),
        HybridLayout(
            "nemotron-h-8b", full_layers=4, mamba_layers=24, kv_heads=8, head_dim=128,
            state_bytes_per_layer=NEMOTRON_H_STATE, mamba_chunk=128,
            source="huggingface.co/nvidia/Nemotron-H-8B-Base-8K config.json: 52 layers, "
                   "hybrid_override_pattern with 24 Mamba2 (M), 4 attention (*), 24 MLP (-), "
                   "num_key_value_heads 8, attention_head_dim 128, mamba_num_heads 128, "
                   "mamba_head_dim 64, ssm_state_size 128, n_groups 8, conv_kernel 4, chunk_size 128, bf16",
            note="the 24 MLP-only layers keep nothing",
        ),
    )
}

__all__ = ["FLA_CHUNK_SIZE", "HybridLayout", "NAMED", "mamba2_state_bytes"]
