"""The arguments of ``KVCacheManager``: vLLM 0.33's constructor and the checks every call shares.

``KVCacheManager`` accepts vLLM 0.33's signature (``kv_cache_config,
max_model_len, scheduler_block_size, hash_block_size, ...``) next to
kvstate's simple one (``num_blocks, block_size, max_model_len, ...``).
:func:`vllm_manager_args` binds vLLM's signature and refuses what kvstate
does not model; :func:`needs_groups` says which configurations need the
grouped (hybrid) manager.  :func:`check_allocation` is the argument check
of ``allocate_slots`` shared by both managers.  Pure functions: nothing
here mutates its arguments.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvstate.config import non_negative_int
from kvstate.engine import Engine
from kvstate.vllm.hashing import HashAlgo
from kvstate.vllm.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    SlidingWindowSpec,
    group_layout,
)
from kvstate.vllm.request import Request


@attrs.frozen
class VllmManagerArgs:
    """vLLM 0.33's ``KVCacheManager`` arguments that kvstate models, plus kvstate's own
    keyword-only ones (the hash settings vLLM reads from globals, the engine)."""

    config: KVCacheConfig
    max_model_len: int
    scheduler_block_size: int
    hash_block_size: int
    max_in_flight_tokens: int
    enable_caching: bool
    log_stats: bool
    enable_kv_cache_events: bool
    hash_algo: HashAlgo
    hash_seed: str | int | None
    keep_events: bool
    engine: Engine | None


def config_argument(args: tuple[Any, ...], kwargs: dict[str, Any]) -> KVCacheConfig | None:
    """The ``KVCacheConfig`` a constructor call passes (first or ``kv_cache_config=``), if any."""
    first = args[0] if args else kwargs.get("kv_cache_config")
    return first if isinstance(first, KVCacheConfig) else None


def needs_groups(config: KVCacheConfig) -> bool:
    """Whether ``config`` needs the grouped manager: several groups, a Mamba group, or a sliding
    window with sparse retention or retained extra tokens (the one-group manager is dense)."""
    if len(config.kv_cache_groups) != 1:
        return True
    spec = config.kv_cache_groups[0].kv_cache_spec
    if isinstance(spec, FullAttentionSpec):
        return False
    if isinstance(spec, SlidingWindowSpec):
        return config.prefix_cache_retention_interval is not None or \
            spec.extra_retained_tokens != 0
    return True


def vllm_manager_args(kv_cache_config: KVCacheConfig, max_model_len: int,
                      scheduler_block_size: int, hash_block_size: int,
                      max_in_flight_tokens: int | None = None, enable_caching: bool = True,
                      use_eagle: bool = False, num_hash_lookahead_tokens: int = 0,
                      num_prefill_lookahead: int = 0, log_stats: bool = False,
                      enable_kv_cache_events: bool = False, dcp_world_size: int = 1,
                      pcp_world_size: int = 1, metrics_collector: Any = None,
                      watermark: float = 0.0, enable_mamba_shared_prefix_checkpoint: bool = False,
                      *, hash_algo: HashAlgo = "sha256_cbor", hash_seed: str | int | None = None,
                      keep_events: bool = True, engine: Engine | None = None) -> VllmManagerArgs:
    """Bind vLLM 0.33's constructor arguments; ``ValueError`` for the unmodelled ones.

    ``enable_mamba_shared_prefix_checkpoint`` is accepted: vLLM applies it only
    to EAGLE groups with fine-grained hits, so without EAGLE it changes nothing.
    """
    if not isinstance(kv_cache_config, KVCacheConfig):
        raise TypeError(f"kv_cache_config must be a KVCacheConfig, got {kv_cache_config!r}")
    unmodelled = {"use_eagle": use_eagle, "num_hash_lookahead_tokens": num_hash_lookahead_tokens,
                  "num_prefill_lookahead": num_prefill_lookahead,
                  "dcp_world_size": dcp_world_size != 1, "pcp_world_size": pcp_world_size != 1,
                  "metrics_collector": metrics_collector is not None, "watermark": watermark}
    for name, value in unmodelled.items():
        if value:
            raise ValueError(f"{name} is not modelled by kvstate (leave it at vLLM's default)")
    for name, count in (("max_model_len", max_model_len),
                        ("scheduler_block_size", scheduler_block_size),
                        ("hash_block_size", hash_block_size)):
        if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
            raise ValueError(f"{name} must be a positive int, got {count!r}")
    in_flight = max_model_len if max_in_flight_tokens is None else \
        non_negative_int("max_in_flight_tokens", max_in_flight_tokens)
    return VllmManagerArgs(kv_cache_config, max_model_len, scheduler_block_size, hash_block_size,
                           in_flight, enable_caching, log_stats, enable_kv_cache_events,
                           hash_algo, hash_seed, keep_events, engine)


def one_group_arguments(options: VllmManagerArgs) -> dict[str, Any]:
    """The one-group manager's arguments for a config that does not need groups (validated)."""
    group_layout(options.config, scheduler_block_size=options.scheduler_block_size,
                 hash_block_size=options.hash_block_size, max_model_len=options.max_model_len,
                 max_in_flight_tokens=options.max_in_flight_tokens,
                 enable_caching=options.enable_caching)
    spec = options.config.kv_cache_groups[0].kv_cache_spec
    return {"num_blocks": options.config.num_blocks, "block_size": spec.block_size,
            "max_model_len": options.max_model_len, "enable_caching": options.enable_caching,
            "sliding_window": spec.sliding_window if isinstance(spec, SlidingWindowSpec) else None,
            "enable_kv_cache_events": options.enable_kv_cache_events,
            "hash_algo": options.hash_algo, "hash_seed": options.hash_seed,
            "log_stats": options.log_stats, "keep_events": options.keep_events,
            "engine": options.engine, "max_in_flight_tokens": options.max_in_flight_tokens}


def check_allocation(request: Request, num_new_tokens: int, num_new_computed_tokens: int,
                     num_lookahead_tokens: int, num_hit_blocks: int, block_size: int,
                     max_model_len: int, covered: int, *, running_with_hits: bool) -> int:
    """``allocate_slots``'s argument checks; the request's local computed tokens.

    ``ValueError`` for a negative or non-int count, nothing to do, hits given
    to a running request, hits that
    are not ``num_new_computed_tokens`` worth of blocks, a call past
    ``max_model_len``, and a scheduler that did not advance
    ``num_computed_tokens`` past what the last allocation (``covered``)
    gave slots to (docs/vllm.md, "The scheduler loop").
    """
    computed = request.num_computed_tokens
    counts = (num_new_tokens, num_new_computed_tokens, num_lookahead_tokens, computed,
              request.num_in_flight_tokens)
    if type(num_new_tokens) is not int or type(num_new_computed_tokens) is not int or \
            type(num_lookahead_tokens) is not int or type(computed) is not int or \
            type(counts[4]) is not int or min(counts) < 0:  # exact ints: no bool or float
        names = ("num_new_tokens", "num_new_computed_tokens", "num_lookahead_tokens",
                 "request.num_computed_tokens", "request.num_in_flight_tokens")
        for name, value in zip(names, counts, strict=True):
            if type(value) is not int or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    if num_new_tokens == 0 and num_new_computed_tokens == 0:
        raise ValueError("num_new_tokens must be greater than 0 when there are no "
                         "computed tokens to adopt")
    if running_with_hits:
        raise ValueError(f"running request {request.request_id!r} cannot take new prefix hits")
    if num_hit_blocks * block_size != num_new_computed_tokens:
        raise ValueError(f"num_new_computed_tokens={num_new_computed_tokens} is not the "
                         f"{num_hit_blocks} hit blocks' tokens")
    num_local = computed + num_new_computed_tokens
    if num_local + num_new_tokens > max_model_len:
        raise ValueError(f"request {request.request_id!r} would reach "
                         f"{num_local + num_new_tokens} tokens, past max_model_len={max_model_len}")
    if computed < covered:
        raise ValueError(
            f"request {request.request_id!r}: num_computed_tokens={computed} but its "
            f"last allocate_slots gave {covered} tokens slots; the scheduler advances "
            "num_computed_tokens by num_new_tokens after each scheduled step (docs/vllm.md)")
    return num_local
