"""Hostile arguments to the hybrid vLLM manager and its configuration: a typed error and
nothing changed, or (for a call vLLM treats as a no-op) nothing changed at all; and the idle
shortcut's bounds end however a held block leaves the cache."""

from __future__ import annotations

from typing import Any

import pytest

from kvstate.backends.persistent import apply_all
from kvstate.vllm import KVCacheManager, Request
from kvstate.vllm.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)

FULL = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="f")
MAMBA = MambaSpec(block_size=4, shapes=((2, 8),), dtypes=("f",), mamba_cache_mode="align")


def window(size: Any, extra: Any = 0) -> SlidingWindowSpec:
    return SlidingWindowSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="f",
                             sliding_window=size, extra_retained_tokens=extra)


def manager(*specs: Any, num_blocks: int = 30, retention: int | None = 0, **options: Any) -> Any:
    groups = [KVCacheGroupSpec([f"g{index}"], spec) for index, spec in enumerate(specs)]
    return KVCacheManager(KVCacheConfig(num_blocks, [], groups, retention), 64, 4, 4, **options)


def snapshot(m: Any) -> tuple[Any, ...]:
    return (m.engine.view.fingerprint(), m.engine.seq, dict(m.holders), dict(m.cursors),
            m.block_pool.free_block_ids())


@pytest.mark.parametrize(("size", "extra"), [(6.5, 0), (True, 0), (8, 1.5), (8, True)])
def test_a_window_that_is_not_an_int_is_refused_at_construction(size: Any, extra: Any) -> None:
    with pytest.raises(ValueError, match="must be an int"):
        manager(FULL, window(size, extra), retention=None)


@pytest.mark.parametrize("bad", [-100, 2.5, True])
def test_max_in_flight_tokens_must_be_a_count(bad: Any) -> None:
    with pytest.raises(ValueError, match="max_in_flight_tokens"):
        KVCacheManager(3, 4, 64, sliding_window=8, max_in_flight_tokens=bad)
    with pytest.raises(ValueError, match="max_in_flight_tokens"):
        manager(FULL, window(8), retention=None, max_in_flight_tokens=bad)


def test_remove_skipped_blocks_of_an_unknown_request_changes_nothing() -> None:
    m = manager(FULL, window(8))
    before = snapshot(m)
    m.remove_skipped_blocks("x" * 4096, 0)  # never allocated: nothing to free, nothing kept
    assert snapshot(m) == before
    with pytest.raises(ValueError, match="at most"):
        m.allocate_slots(Request("x" * 4096, list(range(8)), 4), 8)  # still too long
    request = Request("a", list(range(8)), 4)
    m.allocate_slots(request, 8)
    before = snapshot(m)
    for bad in (2.5, True, -5):
        with pytest.raises(ValueError, match="num_computed_tokens"):
            m.remove_skipped_blocks("a", bad)
        assert snapshot(m) == before
    assert apply_all(m.engine.initial_state, list(m.engine.events)).fingerprint() == \
        m.engine.state.fingerprint()


def test_a_lookup_limit_must_be_a_count_and_stops_before_the_last_token() -> None:
    m = manager(FULL, FULL)
    first = Request("a", list(range(12)), 4)
    m.allocate_slots(first, 12)
    first.num_computed_tokens = 12
    m.cache_blocks(first, 12)
    second = Request("c", list(range(12)), 4)
    for bad in (-1, True, 2.5):
        with pytest.raises(ValueError, match="max_cache_hit_length"):
            m.get_computed_blocks(second, bad)
    _, hit, _ = m.get_computed_blocks(second, 100)
    assert hit == 8  # at most num_tokens - 1, in whole blocks


def test_a_request_id_that_is_not_valid_text_is_refused() -> None:
    with pytest.raises(ValueError, match="not valid Unicode"):
        Request("a\ud800", list(range(8)), 4)
    with pytest.raises(ValueError, match="not valid Unicode"):
        Request("a", list(range(8)), 4, cache_salt="\udfff")


@pytest.mark.parametrize("through_pool", [False, True])
def test_a_held_state_uncached_through_the_pool_is_cached_again(through_pool: bool) -> None:
    # The idle shortcut must not skip a step after a held block left the cache, whichever
    # object's evict_blocks removed it.
    m = manager(FULL, MAMBA, enable_kv_cache_events=True)
    request = Request("r", list(range(22)), 4)
    m.new_step_starts()
    m.allocate_slots(request, 20, full_sequence_must_fit=True)
    request.num_computed_tokens = 20
    m.new_step_starts()
    m.allocate_slots(request, 2)
    request.num_computed_tokens = 22
    request.append_output_token_ids(9)
    state = m.get_block_ids("r")[1][4]  # the prompt's Mamba state, cached
    m.take_events()
    (m.block_pool.evict_blocks if through_pool else m.evict_blocks)({state})
    m.new_step_starts()
    request.num_in_flight_tokens = 2
    m.allocate_slots(request, 1)
    assert [type(event).__name__ for event in m.take_events()] == ["BlockRemoved", "BlockStored"]


def test_a_float8_value_store_is_refused_at_construction() -> None:
    import torch

    from kvstate import ModelConfig
    from kvstate.kv_manager import KVCacheManager as SeedManager

    for dtype in (torch.float8_e5m2, torch.float8_e4m3fn):
        with pytest.raises(TypeError, match="cannot hold stored values"):
            SeedManager(ModelConfig(1, 1, 2, dtype_bytes=1), 4096, 4, dtype=dtype)
