"""KVCacheManager (seed 002): one test per behaviour of issue 6.

Small geometries so every number can be checked by hand.  ``unchanged``
compares the core state's fingerprint and the event count before and after
a call that must change nothing.
"""

from __future__ import annotations

import math
import random

import pytest

from kvstate import ModelConfig, apply_all, check
from kvstate.errors import OutOfMemory
from kvstate.events import Allocate, Append, Assign, Copy, Evict, Insert, Share
from kvstate.kv_manager import KVCacheManager, ModeError, ReservationExceeded

TINY = ModelConfig(num_layers=2, num_kv_heads=1, head_dim=2)  # 16 bytes per token, 8 per layer


def snapshot(manager: KVCacheManager) -> tuple[bytes, int]:
    return manager.engine.state.fingerprint(), len(manager.engine.events)


def vec(*values: float) -> list[float]:
    return [float(v) for v in values]


def basic(tokens: int = 10) -> KVCacheManager:
    return KVCacheManager(TINY, tokens * TINY.bytes_per_token)


def paged(pages: int, page_size: int = 4) -> KVCacheManager:
    return KVCacheManager(TINY, pages * page_size * 8, page_size=page_size)


def fill(manager: KVCacheManager, request_id: str, tokens: int, start: float = 0.0,
         layers: int = 2) -> None:
    for t in range(tokens):
        for layer in range(layers):
            manager.append_token(request_id, layer, vec(start + t, layer), vec(-start - t, 0.5))


# -- Part 1 ------------------------------------------------------------------------------
def test_bytes_per_token_and_max_tokens_are_exact_ints():
    config = ModelConfig(num_layers=3, num_kv_heads=5, head_dim=7, dtype_bytes=2)
    manager = KVCacheManager(config, 10_000)
    assert manager.bytes_per_token == 3 * 5 * 7 * 2 * 2 == 420
    assert manager.max_tokens == 10_000 // 420 == 23
    assert isinstance(manager.bytes_per_token, int) and isinstance(manager.max_tokens, int)
    assert manager.allocate("a", 20, 3) and not manager.allocate("b", 1, 0)


def test_allocate_reserves_prompt_plus_max_gen():
    manager = basic(10)
    assert manager.allocate("a", 3, 4) is True
    assert manager.stats()["used_memory_bytes"] == 7 * 16
    assert manager.engine.state.requests["req/a"].allocated == 7


def test_allocate_returns_false_on_insufficient_memory_and_changes_nothing():
    manager = basic(10)
    assert manager.allocate("a", 6, 0)
    before = snapshot(manager)
    assert manager.allocate("b", 3, 2) is False
    assert snapshot(manager) == before
    assert manager.allocate("b", 4, 0) is True  # exactly the rest fits


def test_allocate_returns_false_on_duplicate_id_and_changes_nothing():
    manager = basic(10)
    assert manager.allocate("a", 1, 1)
    before = snapshot(manager)
    assert manager.allocate("a", 1, 1) is False
    assert snapshot(manager) == before


@pytest.mark.parametrize("prompt, gen, error", [
    (-1, 5, ValueError), (5, -1, ValueError), (0, 0, ValueError), (1.5, 1, TypeError),
    (True, 1, TypeError)])
def test_allocate_rejects_bad_sizes_and_changes_nothing(prompt, gen, error):
    manager = basic(10)
    before = snapshot(manager)
    with pytest.raises(error):
        manager.allocate("a", prompt, gen)
    assert snapshot(manager) == before and manager.mode is None


def test_append_token_stores_the_values_in_the_executor_buffers():
    manager = basic(10)
    manager.allocate("a", 2, 2)
    manager.append_token("a", 1, vec(1.5, -2.0), vec(3.0, 4.25))
    slot = manager.engine.state.slots_of("L1/a")[0]
    keys, values = manager._values().executor.get_kv_buffer(1)
    assert keys[slot].reshape(-1).tolist() == [1.5, -2.0]
    assert values[slot].reshape(-1).tolist() == [3.0, 4.25]
    other_keys, _ = manager._values().executor.get_kv_buffer(0)
    assert other_keys[slot].reshape(-1).tolist() == [0.0, 0.0]  # layer 0 untouched


def test_append_token_errors_are_typed_and_change_nothing():
    manager = basic(10)
    manager.allocate("a", 2, 2)
    before = snapshot(manager)
    with pytest.raises(KeyError):
        manager.append_token("nope", 0, vec(1, 2), vec(1, 2))
    with pytest.raises(ValueError, match="layer 2"):
        manager.append_token("a", 2, vec(1, 2), vec(1, 2))
    with pytest.raises(ValueError, match="layer -1"):
        manager.append_token("a", -1, vec(1, 2), vec(1, 2))
    with pytest.raises(ValueError, match="key has 3 values"):
        manager.append_token("a", 0, vec(1, 2, 3), vec(1, 2))
    with pytest.raises(ValueError, match="value has 1 values"):
        manager.append_token("a", 0, vec(1, 2), vec(1))
    assert snapshot(manager) == before


def test_append_past_the_reservation_raises_reservation_exceeded():
    manager = basic(10)
    manager.allocate("a", 1, 1)
    fill(manager, "a", 2)
    before = snapshot(manager)
    with pytest.raises(ReservationExceeded, match="all 2 reserved tokens") as info:
        manager.append_token("a", 0, vec(0, 0), vec(0, 0))
    assert isinstance(info.value, MemoryError) and info.value.reserved == 2
    assert snapshot(manager) == before


def test_get_kv_returns_exactly_what_was_appended_in_order():
    manager = basic(10)
    manager.allocate("a", 3, 0)
    manager.allocate("b", 3, 0)
    fill(manager, "a", 3, start=10)
    fill(manager, "b", 2, start=20, layers=1)
    keys, values = manager.get_kv("a", 1)
    assert keys == [[10.0, 1.0], [11.0, 1.0], [12.0, 1.0]]
    assert values == [[-10.0, 0.5], [-11.0, 0.5], [-12.0, 0.5]]
    assert all(type(x) is float for row in keys + values for x in row)
    assert manager.get_kv("b", 0) == ([[20.0, 0.0], [21.0, 0.0]], [[-20.0, 0.5], [-21.0, 0.5]])
    assert manager.get_kv("b", 1) == ([], [])


def test_get_kv_round_trips_through_float16_within_the_documented_tolerance():
    rng = random.Random(7)
    config = ModelConfig(num_layers=1, num_kv_heads=4, head_dim=8)
    manager = KVCacheManager(config, 64 * config.bytes_per_token)
    manager.allocate("a", 64, 0)
    written = []
    for _ in range(64):
        key = [rng.uniform(-1000, 1000) for _ in range(32)]
        value = [rng.uniform(-1, 1) for _ in range(32)]
        manager.append_token("a", 0, key, value)
        written.append((key, value))
    keys, values = manager.get_kv("a", 0)
    for (key, value), got_k, got_v in zip(written, keys, values, strict=True):
        for x, y in zip(key + value, got_k + got_v, strict=True):
            assert abs(x - y) <= max(abs(x) * 2**-11, 2**-25)
    assert any(x != y for (key, _), got in zip(written, keys, strict=True)
               for x, y in zip(key, got, strict=True))  # it really is float16


def test_free_releases_memory_and_raises_key_error_for_unknown():
    manager = basic(10)
    manager.allocate("a", 5, 5)
    manager.free("a")
    assert manager.stats()["used_memory_bytes"] == 0
    before = snapshot(manager)
    with pytest.raises(KeyError):
        manager.free("a")
    with pytest.raises(KeyError):
        manager.get_kv("a", 0)
    assert snapshot(manager) == before
    assert manager.allocate("b", 10, 0)  # all of it is back


def test_stats_has_exactly_the_five_keys_and_counts_layer0_tokens_once():
    manager = basic(10)
    manager.allocate("a", 4, 0)
    manager.allocate("b", 4, 0)
    fill(manager, "a", 3)  # both layers
    fill(manager, "b", 2, layers=1)  # layer 0 only
    manager.append_token("b", 1, vec(1, 1), vec(1, 1))  # layer 1 alone adds no token
    stats = manager.stats()
    assert list(stats) == ["total_memory_bytes", "used_memory_bytes", "num_active_requests",
                           "total_cached_tokens", "utilization_pct"]
    assert stats == {"total_memory_bytes": 160, "used_memory_bytes": 128,
                     "num_active_requests": 2, "total_cached_tokens": 5, "utilization_pct": 80.0}
    assert type(stats["utilization_pct"]) is float
    assert manager.memory_efficiency() == (3 * 2 + 2 + 1) / (8 * 2)


# -- Part 2 --------------------------------------------------------------------------------
def test_page_bytes_follow_the_seed_formula():
    config = ModelConfig(num_layers=32, num_kv_heads=8, head_dim=128)
    manager = KVCacheManager(config, 8 * 1024**3, page_size=16)
    assert manager.bytes_per_page == 16 * 8 * 128 * 2 * 2 == 65536
    assert manager.max_pages == 8 * 1024**3 // 65536
    assert manager.allocate_paged("a", 16)
    assert manager.stats()["used_memory_bytes"] == 32 * 65536  # one page per layer


def test_allocate_paged_takes_only_the_prompt_pages_with_a_partial_last_page():
    manager = paged(20)
    assert manager.allocate_paged("a", 5) is True  # ceil(5 / 4) = 2 pages per layer
    state = manager.engine.state
    assert len(state.requests["L0/a"].pages) == 2 and len(state.requests["L1/a"].pages) == 2
    assert manager.stats()["used_memory_bytes"] == 4 * 32
    assert manager.stats()["total_cached_tokens"] == 0


def test_each_page_belongs_to_one_layer_of_one_request():
    manager = paged(20)
    manager.allocate_paged("a", 5)
    manager.allocate_paged("b", 8)
    tables = [list(manager.engine.state.requests[f"L{layer}/{r}"].pages)
              for r in ("a", "b") for layer in range(2)]
    pages = [page for table in tables for page in table]
    assert len(pages) == len(set(pages)) == 8
    assert all(manager.engine.state.holders[p] == (name,) for table, name in
               zip(tables, ["L0/a", "L1/a", "L0/b", "L1/b"], strict=True) for p in table)


def test_allocate_paged_false_when_pages_are_short_and_on_duplicates():
    manager = paged(5)
    assert manager.allocate_paged("a", 4)  # 2 pages
    before = snapshot(manager)
    assert manager.allocate_paged("b", 5) is False  # needs 4, 3 free
    assert manager.allocate_paged("a", 1) is False
    assert snapshot(manager) == before
    assert manager.allocate_paged("b", 3)


def test_append_token_paged_allocates_lazily_at_page_boundaries():
    manager = paged(20)
    manager.allocate_paged("a", 3)
    counts = []
    for t in range(9):
        manager.append_token_paged("a", 0, vec(t, 0), vec(t, 0))
        counts.append(len(manager.engine.state.requests["L0/a"].pages))
    assert counts == [1, 1, 1, 1, 2, 2, 2, 2, 3]
    assert len(manager.engine.state.requests["L1/a"].pages) == 1
    assert manager.get_kv("a", 0)[0] == [[float(t), 0.0] for t in range(9)]


def test_append_token_paged_raises_out_of_memory_when_no_page_is_free():
    manager = paged(2)
    manager.allocate_paged("a", 4)  # both pages
    fill(manager, "a", 4)
    before = snapshot(manager)
    with pytest.raises(OutOfMemory, match="need 1 pages"):
        manager.append_token_paged("a", 0, vec(0, 0), vec(0, 0))
    assert snapshot(manager) == before
    assert manager.get_kv("a", 0)[0] == [[float(t), 0.0] for t in range(4)]


def test_memory_efficiency_is_one_for_full_pages():
    manager = paged(20)
    manager.allocate_paged("a", 8)
    fill(manager, "a", 8)
    assert manager.memory_efficiency() == 1.0


def test_memory_efficiency_counts_internal_fragmentation_over_all_layers():
    manager = paged(20)
    manager.allocate_paged("a", 5)  # 2 pages per layer
    fill(manager, "a", 5)  # 5 of 8 slots in each layer
    fill(manager, "a", 1, layers=1)  # layer 0 only: 6 of 8
    manager.allocate_paged("b", 0)
    manager.append_token_paged("b", 1, vec(1, 1), vec(1, 1))  # 1 of 4 in one page
    assert manager.memory_efficiency() == (6 + 5 + 1) / (5 * 4)
    assert paged(20).memory_efficiency() == 0.0


# -- Part 3 -----------------------------------------------------------------------------------
def test_allocate_with_prefix_needs_enable_prefix_cache():
    manager = paged(20)
    with pytest.raises(ModeError, match="enable_prefix_cache"):
        manager.allocate_with_prefix("a", "sys", 4, 4)
    manager.enable_prefix_cache()
    assert manager.allocate_with_prefix("a", "sys", 4, 4)


def test_new_prefix_is_registered_and_a_seen_one_is_shared_by_refcount():
    manager = paged(30)
    manager.enable_prefix_cache()
    assert manager.allocate_with_prefix("a", "sys", 8, 3)  # 2 prefix + 1 unique page per layer
    assert manager.stats()["used_memory_bytes"] == 6 * 32
    assert any(isinstance(e, Insert) for e in manager.engine.events)
    assert manager.allocate_with_prefix("b", "sys", 8, 5)  # shares 2, allocates 2 per layer
    assert manager.stats()["used_memory_bytes"] == 10 * 32
    state = manager.engine.state
    for layer in range(2):
        a, b = state.requests[f"L{layer}/a"].pages, state.requests[f"L{layer}/b"].pages
        assert a[:2] == b[:2] and a[2] != b[2]
        for page in a[:2]:
            assert f"L{layer}/a" in state.holders[page] and f"L{layer}/b" in state.holders[page]
            assert page in state.page_node  # the tree keeps it for later requests
    assert manager.stats()["total_cached_tokens"] == 0 + 8  # b sees the prefix as stored


def test_allocate_with_prefix_false_on_insufficient_memory_changes_nothing():
    manager = paged(6)
    manager.enable_prefix_cache()
    assert manager.allocate_with_prefix("a", "sys", 4, 0)  # 2 pages
    manager.free("a")  # prefix retained, evictable
    assert manager.allocate_paged("b", 4)  # 2 pages
    before = snapshot(manager)
    assert manager.allocate_with_prefix("c", "other", 4, 5) is False  # needs 6 > 2 free + 2
    assert snapshot(manager) == before  # the retained prefix was not evicted either
    assert manager.allocate_with_prefix("c", "sys", 4, 4) is True  # reuse needs only 2


def test_copy_on_write_keeps_other_holders_unchanged():
    manager = paged(30)
    manager.enable_prefix_cache()
    manager.allocate_with_prefix("a", "sys", 6, 2)  # prefix ends inside page 2 of each layer
    fill(manager, "a", 6, start=100)  # a writes the prefix content (no copy)
    assert not any(isinstance(e, Copy) for e in manager.engine.events)
    manager.allocate_with_prefix("b", "sys", 6, 2)
    shared = manager.engine.state.requests["L0/b"].pages[1]
    manager.append_token_paged("b", 0, vec(7, 7), vec(7, 7))  # lands in the shared page
    events = manager.engine.events
    tail = [type(e) for e in events[-4:]]
    assert tail == [Allocate, Copy, Assign, Append]
    copy = events[-3]
    assert isinstance(copy, Copy) and copy.src_pages == (shared,)
    assert manager.engine.state.requests["L0/b"].pages[1] == copy.dst_pages[0]
    prefix_keys = [[100.0 + t, 0.0] for t in range(6)]
    assert manager.get_kv("b", 0)[0] == prefix_keys + [[7.0, 7.0]]
    assert manager.get_kv("a", 0)[0] == prefix_keys  # a never sees b's write
    manager.append_token_paged("a", 0, vec(8, 8), vec(8, 8))  # a copies too
    assert manager.get_kv("a", 0)[0] == prefix_keys + [[8.0, 8.0]]
    assert manager.get_kv("b", 0)[0] == prefix_keys + [[7.0, 7.0]]
    assert check(manager.engine.state) == []


def test_freed_prefix_stays_reusable_then_is_evicted_lru():
    from kvstate.planner.kv_layout import prefix_code

    manager = paged(8)
    manager.enable_prefix_cache()
    manager.allocate_with_prefix("a", "first", 4, 0)  # created first
    manager.allocate_with_prefix("b", "second", 4, 0)
    manager.free("a")
    manager.free("b")
    assert manager.stats()["used_memory_bytes"] == 4 * 32  # both retained
    assert manager.allocate_with_prefix("c", "first", 4, 0)  # reuse: no new pages
    assert manager.stats()["used_memory_bytes"] == 4 * 32
    manager.free("c")  # "first" is now the most recently used, "second" the least
    assert manager.allocate_paged("d", 12)  # needs 6 pages, 4 free: evicts one prefix
    evicts = [e for e in manager.engine.events if isinstance(e, Evict)]
    assert len(evicts) == 1 and len(evicts[0].nodes) == 1
    remaining = [n.key[0] for i, n in manager.engine.state.nodes.items() if i]
    assert remaining == [prefix_code("first")]
    assert check(manager.engine.state) == []


def test_a_reused_prefix_shows_the_registrants_values_and_zeros_before():
    manager = paged(30)
    manager.enable_prefix_cache()
    manager.allocate_with_prefix("a", "sys", 3, 1)
    manager.allocate_with_prefix("b", "sys", 3, 1)
    assert manager.get_kv("b", 1) == ([[0.0, 0.0]] * 3, [[0.0, 0.0]] * 3)
    fill(manager, "a", 2, start=50)
    assert manager.get_kv("b", 1)[0] == [[50.0, 1.0], [51.0, 1.0], [0.0, 0.0]]


def test_prefix_hash_with_another_length_is_a_value_error():
    manager = paged(30)
    manager.enable_prefix_cache()
    manager.allocate_with_prefix("a", "sys", 4, 1)
    before = snapshot(manager)
    with pytest.raises(ValueError, match="cached with 4 tokens"):
        manager.allocate_with_prefix("b", "sys", 5, 1)
    assert snapshot(manager) == before


# -- events, modes ---------------------------------------------------------------------------
def test_every_call_is_events_that_replay_to_the_same_state():
    manager = paged(16)
    manager.enable_prefix_cache()
    manager.allocate_with_prefix("a", "sys", 6, 2)
    fill(manager, "a", 8)
    manager.allocate_with_prefix("b", "sys", 6, 1)
    fill(manager, "b", 3)
    manager.free("a")
    manager.allocate_paged("c", 9)
    fill(manager, "c", 2)
    state = apply_all(manager.engine.initial_state, manager.engine.events)
    assert state == manager.engine.state
    assert check(state) == []
    kinds = {type(e) for e in manager.engine.events}
    assert {Allocate, Append, Share, Copy, Assign, Insert} <= kinds


def test_modes_do_not_mix():
    manager = basic(10)
    manager.allocate("a", 1, 1)
    with pytest.raises(ModeError):
        manager.allocate_paged("b", 1)
    with pytest.raises(ModeError):
        manager.enable_prefix_cache()
    with pytest.raises(ModeError):
        manager.append_token_paged("a", 0, vec(1, 1), vec(1, 1))
    other = paged(4)
    other.allocate_paged("a", 1)
    with pytest.raises(ModeError):
        other.allocate("b", 1, 1)
    other.append_token("a", 0, vec(1, 1), vec(1, 1))  # the Part 1 call works on paged requests
    assert other.get_kv("a", 0) == ([[1.0, 1.0]], [[1.0, 1.0]])


def test_a_budget_below_one_page_holds_nothing():
    manager = KVCacheManager(TINY, 31, page_size=4)  # one page is 32 bytes
    assert manager.max_pages == 0
    assert manager.allocate_paged("a", 1) is False
    assert manager.allocate_paged("b", 0) is True
    with pytest.raises(OutOfMemory):
        manager.append_token_paged("b", 0, vec(1, 1), vec(1, 1))
    assert manager.stats()["used_memory_bytes"] == 0
    assert math.isclose(manager.stats()["utilization_pct"], 0.0)


def test_a_recorded_run_replays_clean(tmp_path):
    from kvstate.log.recorder import Recorder
    from kvstate.replay import replay_path

    manager = paged(16)
    path = tmp_path / "kv.log"
    with Recorder(manager, path, checkpoint_every=5, fsync=False):
        manager.enable_prefix_cache()
        manager.allocate_with_prefix("a", "sys", 6, 2)
        fill(manager, "a", 8)
        manager.allocate_with_prefix("b", "sys", 6, 1)
        fill(manager, "b", 3)
        manager.free("a")
        manager.free("b")
        manager.allocate_paged("c", 30)  # evicts the retained prefix
    result = replay_path(str(path))
    assert result.ok, result.failure
    assert result.state == manager.engine.state
    assert result.summary.evictions == 1


def test_value_head_dim_and_a_seed_style_dataclass_config():
    from dataclasses import dataclass

    @dataclass
    class SeedConfig:  # the seed's own ModelConfig shape
        num_layers: int = 1
        num_kv_heads: int = 2
        head_dim: int = 2
        dtype_bytes: int = 2

    manager = KVCacheManager(SeedConfig(), 4 * 16)
    assert manager.bytes_per_token == 16 and manager.allocate("a", 4, 0)
    manager.append_token("a", 0, vec(1, 2, 3, 4), vec(5, 6, 7, 8))
    assert manager.get_kv("a", 0) == ([[1.0, 2.0, 3.0, 4.0]], [[5.0, 6.0, 7.0, 8.0]])

    mla_like = ModelConfig(num_layers=1, num_kv_heads=2, head_dim=2, v_head_dim=3)
    other = KVCacheManager(mla_like, 10 * mla_like.bytes_per_token, page_size=2)
    other.allocate_paged("a", 1)
    with pytest.raises(ValueError, match="value has 4 values"):
        other.append_token_paged("a", 0, vec(1, 2, 3, 4), vec(1, 2, 3, 4))
    other.append_token_paged("a", 0, vec(1, 2, 3, 4), vec(1, 2, 3, 4, 5, 6))
    assert other.get_kv("a", 0) == ([[1.0, 2.0, 3.0, 4.0]], [[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])


@pytest.mark.cuda
def test_values_and_copy_on_write_on_a_cuda_device():
    manager = KVCacheManager(TINY, 30 * 4 * 8, page_size=4, device="cuda")
    manager.enable_prefix_cache()
    manager.allocate_with_prefix("a", "sys", 6, 2)
    fill(manager, "a", 6, start=100)
    manager.allocate_with_prefix("b", "sys", 6, 2)
    manager.append_token("b", 0, vec(7, 7), vec(7, 7))
    assert manager._values().executor.get_kv_buffer(0)[0].device.type == "cuda"
    prefix_keys = [[100.0 + t, 0.0] for t in range(6)]
    assert manager.get_kv("b", 0)[0] == prefix_keys + [[7.0, 7.0]]
    assert manager.get_kv("a", 0)[0] == prefix_keys
