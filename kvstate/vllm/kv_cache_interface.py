"""vLLM 0.33's KV-cache configuration names: ``KVCacheConfig``, its groups and their specs.

Only what the KV-cache manager reads is kept, under vLLM 0.33's class and
field names, so a configuration written for vLLM builds a kvstate
``KVCacheManager`` unchanged.  The specs are frozen and compare by value,
as vLLM's dataclasses do: two groups with equal specs are looked up
together (vLLM's ``SpecGroup``).  Layer shapes and dtypes are carried for
equality only; kvstate stores no KV.  Nothing here mutates its arguments.

:func:`group_layout` turns a configuration into the planner's
``HybridLayout`` (``kvstate.planner.hybrid_vllm``), refusing what kvstate
does not model (docs/vllm.md, "Hybrid models").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from kvstate.planner.alloc import cdiv
from kvstate.planner.hybrid_hits import GroupRule, HybridLayout

__all__ = [
    "FullAttentionSpec",
    "KVCacheConfig",
    "KVCacheGroupSpec",
    "KVCacheSpec",
    "MambaSpec",
    "SlidingWindowSpec",
    "group_layout",
    "spec_kind",
    "spec_sliding_window",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class KVCacheSpec:
    """The KV-cache format of one layer; ``block_size`` tokens per block."""

    block_size: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class FullAttentionSpec(KVCacheSpec):
    """Full attention (every token's KV kept until the request ends).

    ``sliding_window`` / ``attention_chunk_size`` only record a layer's own
    window when vLLM's hybrid allocator is off; the manager treats the
    group as full attention, as vLLM does.
    """

    num_kv_heads: int
    head_size: int
    dtype: Any
    head_size_v: int | None = None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class SlidingWindowSpec(KVCacheSpec):
    """Sliding-window attention over the last ``sliding_window`` tokens (``extra_retained_tokens``
    more are kept below the window, unread)."""

    num_kv_heads: int
    head_size: int
    dtype: Any
    sliding_window: int
    head_size_v: int | None = None
    extra_retained_tokens: int = 0

    def max_admission_blocks_per_request(self, max_in_flight_tokens: int,
                                         max_model_len: int) -> int:
        """vLLM's per-request admission cap in blocks: the window, the in-flight tokens and one
        block for a window that does not start on a block boundary."""
        tokens = min(self.sliding_window - 1 + self.extra_retained_tokens + max_in_flight_tokens,
                     max_model_len)
        return cdiv(tokens, self.block_size) + 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class MambaSpec(KVCacheSpec):
    """A Mamba / linear-attention state per block.  Prefix caching needs
    ``mamba_cache_mode="align"`` (vLLM's choice whenever caching is on)."""

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[Any, ...]
    page_size_padded: int | None = None
    mamba_type: str = "mamba2"
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0
    num_prefill_checkpoint_blocks: int = 0
    prefill_checkpoint_alignment: int | None = None


@dataclasses.dataclass
class KVCacheGroupSpec:
    """Layers sharing one block table (vLLM's KV-cache group)."""

    layer_names: list[str]
    kv_cache_spec: KVCacheSpec
    is_eagle_group: bool = False


@dataclasses.dataclass
class KVCacheConfig:
    """``num_blocks`` blocks shared by ``kv_cache_groups`` (``kv_cache_tensors`` is not read).

    ``prefix_cache_retention_interval``: ``None`` (this dataclass's default,
    as in vLLM) caches sliding-window and Mamba blocks densely; ``0`` (the
    engine's ``CacheConfig`` default) keeps only the replay boundary and
    shared-prefix junctions; a positive multiple of the block size keeps one
    tail per that many tokens.
    """

    num_blocks: int
    kv_cache_tensors: list[Any]
    kv_cache_groups: list[KVCacheGroupSpec]
    prefix_cache_retention_interval: int | None = None


def spec_kind(spec: KVCacheSpec) -> str:
    """vLLM's ``get_kv_cache_spec_kind(spec).value`` for the specs modelled here."""
    if isinstance(spec, FullAttentionSpec):
        return "full_attention"
    if isinstance(spec, SlidingWindowSpec):
        return "sliding_window"
    if isinstance(spec, MambaSpec):
        return "mamba"
    return "unknown"


def spec_sliding_window(spec: KVCacheSpec) -> int | None:
    """vLLM's ``get_kv_cache_spec_sliding_window``: set for sliding-window specs only."""
    return spec.sliding_window if isinstance(spec, SlidingWindowSpec) else None


def group_layout(config: KVCacheConfig, *, scheduler_block_size: int, hash_block_size: int,
                 max_model_len: int, max_in_flight_tokens: int, enable_caching: bool,
                 ) -> HybridLayout:
    """The planner's view of ``config``; ``ValueError`` for what kvstate does not model.

    Modelled: full-attention, sliding-window and Mamba ("align") groups of
    one block size (equal to the hash and scheduler block sizes), no EAGLE
    groups, no Mamba speculative or prefill-checkpoint blocks.
    """
    groups = list(config.kv_cache_groups)
    if not groups:
        raise ValueError("a KV-cache config needs at least one group")
    if isinstance(config.num_blocks, bool) or not isinstance(config.num_blocks, int) \
            or config.num_blocks < 2:
        raise ValueError(f"num_blocks must be an int >= 2, got {config.num_blocks!r}")
    size = groups[0].kv_cache_spec.block_size
    if scheduler_block_size != size or hash_block_size != size:
        raise ValueError(f"scheduler_block_size={scheduler_block_size} and hash_block_size="
                         f"{hash_block_size} must equal the groups' block size {size}")
    rules = [_group_rule(group, size, max_model_len, max_in_flight_tokens) for group in groups]
    retention = config.prefix_cache_retention_interval
    _check_retention(retention, size, rules)
    lookups: list[tuple[KVCacheSpec, list[int]]] = []
    for index, group in enumerate(groups):  # equal specs are looked up together
        for spec, members in lookups:
            if spec == group.kv_cache_spec:
                members.append(index)
                break
        else:
            lookups.append((group.kv_cache_spec, [index]))
    lookups.sort(key=lambda entry: not isinstance(entry[0], FullAttentionSpec))  # stable
    return HybridLayout(tuple(rules), tuple(tuple(members) for _, members in lookups),
                        retention, enable_caching, len(groups) > 1)


def _group_rule(group: KVCacheGroupSpec, size: int, max_model_len: int,
                max_in_flight_tokens: int) -> GroupRule:
    spec = group.kv_cache_spec
    if group.is_eagle_group:
        raise ValueError("EAGLE / MTP groups are not modelled")
    if spec.block_size != size:
        raise ValueError(f"every group must have block size {size} (got {spec.block_size}); "
                         "mixed block sizes are not modelled")
    if isinstance(spec, FullAttentionSpec):
        return GroupRule("full")
    if isinstance(spec, SlidingWindowSpec):
        for name in ("sliding_window", "extra_retained_tokens"):
            value = getattr(spec, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, got {value!r}")
        if spec.sliding_window < 2 or spec.extra_retained_tokens < 0:
            raise ValueError(f"sliding_window must be >= 2 (got {spec.sliding_window}) and "
                             "extra_retained_tokens >= 0")
        cap = spec.max_admission_blocks_per_request(max_in_flight_tokens, max_model_len)
        return GroupRule("swa", spec.sliding_window, spec.extra_retained_tokens, cap)
    if isinstance(spec, MambaSpec):
        if spec.mamba_cache_mode != "align":
            raise ValueError("Mamba groups are modelled in mamba_cache_mode='align' only "
                             f"(vLLM's mode whenever prefix caching is on), got "
                             f"{spec.mamba_cache_mode!r}")
        if spec.num_speculative_blocks or spec.num_prefill_checkpoint_blocks:
            raise ValueError("Mamba speculative and prefill-checkpoint blocks are not modelled")
        return GroupRule("mamba")
    raise ValueError(f"{type(spec).__name__} is not a modelled KV-cache spec")


def _check_retention(retention: int | None, size: int, rules: Sequence[GroupRule]) -> None:
    """vLLM's ``_validate_prefix_cache_retention_interval``."""
    if retention is None:
        return
    if isinstance(retention, bool) or not isinstance(retention, int):
        raise ValueError(f"prefix_cache_retention_interval must be an int or None, "
                         f"got {retention!r}")
    if not any(rule.kind != "full" for rule in rules):
        if retention == 0:
            return
        raise ValueError("prefix_cache_retention_interval is set but there is no "
                         "sliding-window or Mamba group; set it to 0")
    if retention < 0 or retention % size:
        raise ValueError(f"prefix_cache_retention_interval ({retention}) must be non-negative "
                         f"and a multiple of the block size ({size})")
