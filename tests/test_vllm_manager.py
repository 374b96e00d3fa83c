"""kvstate.vllm front end: typed rejections (vLLM's known bugs), core mapping, logs, events."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstate import apply
from kvstate.canonical import components
from kvstate.engine import Engine
from kvstate.errors import InvalidEvent
from kvstate.events import (
    BlockAlloc,
    BlockCache,
    BlockClear,
    BlockHold,
    BlockRelease,
    BlockUncache,
    ReqAlloc,
    decode_event,
    encode_event,
)
from kvstate.invariants import check
from kvstate.log import Recorder, read_events
from kvstate.replay import replay_path
from kvstate.state import Geometry, block_child_key, initial_state
from kvstate.vllm.block_pool import BlockPool
from kvstate.vllm.events_bridge import NodeHashes
from kvstate.vllm.kv_events import KVEventBatch, decode_event_batch, encode_event_batch
from kvstate.vllm.manager import KVCacheManager
from kvstate.vllm.request import Request
from tests.vllm_helpers import admit, ids

BS = 4


def block_state(num_pages: int = 4) -> object:
    return initial_state(Geometry(num_pages=num_pages, page_size=BS, mode="block"))


# -- deviations from vLLM's bugs: rejected, nothing changed ----------------------------------
def test_double_free_is_rejected_and_changes_nothing() -> None:
    pool = BlockPool(5, True, BS)
    blocks = pool.get_new_blocks(2)
    pool.free_blocks(blocks)
    before = pool.engine.state
    with pytest.raises(InvalidEvent, match="double free"):
        pool.free_blocks(blocks[:1])
    assert pool.engine.state is before
    assert pool.blocks[1].ref_cnt == 0


def test_duplicate_inside_one_free_is_rejected() -> None:
    pool = BlockPool(5, True, BS)
    [block] = pool.get_new_blocks(1)
    pool.touch([block])
    with pytest.raises(InvalidEvent, match="duplicate page"):
        pool.free_blocks([block, block])
    assert block.ref_cnt == 2
    pool.free_blocks([block])
    pool.free_blocks([block])
    assert block.ref_cnt == 0 and pool.free_block_ids().count(1) == 1


def test_null_block_is_skipped_by_touch_and_free() -> None:
    pool = BlockPool(4, True, BS)
    pool.touch([pool.null_block])
    pool.free_blocks([pool.null_block, pool.null_block])
    assert pool.null_block.ref_cnt == 0
    assert 0 not in pool.free_block_ids()
    assert check(pool.engine.state) == []


def test_pool_free_of_a_request_held_block_is_rejected() -> None:
    manager = KVCacheManager(6, BS, 64)
    admit(manager, Request("a", list(range(6)), BS))
    with pytest.raises(InvalidEvent, match="not held by 0"):
        manager.block_pool.free_blocks([manager.block_pool.blocks[1]])


# -- bad input -----------------------------------------------------------------------------------
def test_bad_arguments_raise_typed_errors() -> None:
    with pytest.raises(ValueError, match="num_gpu_blocks"):
        BlockPool(1, True, BS)
    with pytest.raises(ValueError, match="sliding_window"):
        KVCacheManager(4, BS, 64, sliding_window=1)
    with pytest.raises(TypeError, match="token ids"):
        Request("a", [1, "x"], BS)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="request_id"):
        Request(1, [1], BS)  # type: ignore[arg-type]
    manager = KVCacheManager(4, BS, 64)
    with pytest.raises(ValueError, match="num_new_tokens must be greater than 0"):
        manager.allocate_slots(Request("a", [1], BS), 0)
    with pytest.raises(ValueError, match="block_size"):
        manager.get_computed_blocks(Request("b", [1], 8))
    with pytest.raises(ValueError, match="hash_seed"):
        manager.get_computed_blocks(Request("c", [1], BS, hash_seed="1"))
    with pytest.raises(ValueError, match="Invalid block_id"):
        manager.evict_blocks({9})
    pool = manager.block_pool
    before = pool.engine.state
    with pytest.raises(ValueError, match="Cannot get 4 free blocks"):
        pool.get_new_blocks(4)
    with pytest.raises(ValueError, match="num_blocks must be >= 0, got -1"):
        pool.get_new_blocks(-1)  # vLLM 0.33 would count one more free block
    assert pool.engine.state is before
    with pytest.raises(TypeError, match="not a block of this pool"):
        pool.free_blocks([BlockPool(4, True, BS).blocks[1]])


def test_running_request_cannot_take_new_hits() -> None:
    manager = KVCacheManager(10, BS, 64)
    admit(manager, Request("a", list(range(9)), BS))
    second = Request("b", list(range(9)), BS)
    blocks, hit, _ = manager.get_computed_blocks(second)
    assert hit == 8
    manager.allocate_slots(second, 1, hit, blocks)
    with pytest.raises(ValueError, match="running request"):
        manager.allocate_slots(second, 1, 4, blocks)


def test_refused_allocation_changes_nothing() -> None:
    manager = KVCacheManager(4, BS, 64)
    admit(manager, Request("a", list(range(8)), BS))
    before = manager.engine.state
    assert admit(manager, Request("b", list(range(50, 62)), BS))[2] is None
    assert manager.engine.state is before


# -- the core mapping ---------------------------------------------------------------------------
def test_radix_encoding_is_unchanged_and_block_mode_is_marked() -> None:
    radix = dict(components(initial_state(Geometry(num_pages=3))))
    assert radix["geometry"] == [3, 1, 0, 1 << 20]
    block = dict(components(initial_state(Geometry(num_pages=3, mode="block"))))
    assert block["geometry"] == [3, 1, 0, 1 << 20, "block"]
    with pytest.raises(ValueError, match="mode"):
        Geometry(num_pages=3, mode="paged")


def test_block_events_are_rejected_in_radix_mode() -> None:
    state = initial_state(Geometry(num_pages=3))
    with pytest.raises(InvalidEvent, match="block-mode geometry"):
        apply(state, BlockAlloc(0, (1,)))


def test_block_rule_preconditions() -> None:
    state = block_state()
    with pytest.raises(InvalidEvent, match="not the head"):
        apply(state, BlockAlloc(0, (2,)))
    state = apply(state, BlockAlloc(0, (1, 2)))
    key = (1, 2, 3, 4)
    with pytest.raises(InvalidEvent, match="new node id must be 1"):
        apply(state, BlockCache(0, ((5, key, None, 1),)))
    with pytest.raises(InvalidEvent, match="is free"):
        apply(state, BlockCache(0, ((1, key, None, 3),)))
    cached = apply(state, BlockCache(0, ((1, key, None, 1), (2, (5, 6, 7, 8), None, 2))))
    assert cached.nodes[0].children[block_child_key(key)] == 1
    with pytest.raises(InvalidEvent, match="already cached"):
        apply(cached, BlockCache(1, ((2, (5, 6, 7, 8), None, 2),)))
    with pytest.raises(InvalidEvent, match="not a cached copy"):
        apply(cached, BlockUncache((1,), (2,)))
    released = apply(cached, BlockRelease(0, (2, 1)))
    assert list(released.free_pages) == [3, 4, 2, 1]
    with pytest.raises(InvalidEvent, match="still cached"):
        apply(apply(released, BlockAlloc(0, (3, 4))), BlockAlloc(0, (2,)))
    # Uncaching the parent keeps it as a hollow node while the child is cached.
    hollow = apply(released, BlockUncache((1,), (1,)))
    assert hollow.nodes[1].pages == () and check(hollow) == []
    pruned = apply(hollow, BlockUncache((2,), (2,)))
    assert list(pruned.nodes) == [0] and pruned.evictable_size == 0
    assert check(pruned) == []
    cleared = apply(released, BlockClear())
    assert len(cleared.nodes) == 1 and list(cleared.free_pages) == [3, 4, 2, 1]


def test_block_hold_revives_and_requests_hold_once() -> None:
    state = apply(block_state(), ReqAlloc(("r",)))
    state = apply(state, BlockHold("r", (0, 3)))
    assert list(state.requests["r"].pages) == [0, 3] and 3 not in state.free_pages
    with pytest.raises(InvalidEvent, match="already holds"):
        apply(state, BlockHold("r", (3,)))
    with pytest.raises(InvalidEvent, match="null page"):
        apply(state, BlockHold(0, (0,)))
    with pytest.raises(InvalidEvent, match="must release all"):
        apply(state, BlockRelease("r", (), True, True))
    closed = apply(state, BlockRelease("r", (3,), True, True))
    assert "r" not in closed.requests and list(closed.free_pages)[0] == 3
    assert check(closed) == []


def test_block_events_round_trip_through_the_record_form() -> None:
    events = [BlockAlloc("r", (1, 2)), BlockHold(0, (3,)), BlockRelease("r", (2, 1), False, True),
              BlockCache(0, ((1, (1, 2), (("lora", "a", "/p"),), 1),), 0),
              BlockUncache((1,), (1,)), BlockClear()]
    for evt in events:
        assert decode_event(encode_event(evt)) == evt


def test_manager_tables_are_core_request_tables() -> None:
    manager = KVCacheManager(12, BS, 64, sliding_window=5, enable_caching=False)
    request = Request("w", list(range(14)), BS)
    assert ids(admit(manager, request)[2]) == [1, 2, 3, 4]
    assert request.num_computed_tokens == 14
    request.append_output_token_ids(9)
    manager.allocate_slots(request, 1)
    record = manager.engine.state.requests["w"]
    assert list(record.pages) == [0, 0, 3, 4] == manager.get_block_ids("w")[0]
    assert manager.block_pool.blocks[3].ref_cnt == 1
    assert check(manager.engine.state) == []
    manager.free(request)
    assert "w" not in manager.engine.state.requests
    assert manager.block_pool.get_usage() == 0.0


# -- logs and events ------------------------------------------------------------------------------
def _workload(manager: KVCacheManager) -> None:
    requests = [Request(f"r{i}", [i % 2] * 8 + list(range(i, i + 5)), BS) for i in range(6)]
    for index, request in enumerate(requests):
        if admit(manager, request)[2] is not None:
            request.append_output_token_ids(index)
            manager.allocate_slots(request, 1)
        if index % 2:
            manager.free(requests[index - 1])
    manager.evict_blocks({1, 2})


def test_recorded_log_replays_with_invariants(tmp_path: Path) -> None:
    manager = KVCacheManager(10, BS, 64, enable_kv_cache_events=True)
    path = tmp_path / "vllm.kvlog"
    with Recorder(manager, str(path)):
        _workload(manager)
    result = replay_path(str(path))
    assert result.ok, result.failure
    assert result.state == manager.engine.state
    assert result.header.geometry.mode == "block"


def test_vllm_events_are_derivable_from_the_core_log(tmp_path: Path) -> None:
    manager = KVCacheManager(10, BS, 64, enable_kv_cache_events=True)
    path = tmp_path / "vllm.kvlog"
    with Recorder(manager, str(path)):
        _workload(manager)
    live = manager.block_pool.take_events()
    assert live
    listener = NodeHashes(emit_events=True)
    header, events = read_events(str(path))
    engine = Engine(header.geometry)
    engine.subscribe(listener)
    for evt in events:
        engine.apply(evt)
    assert listener.take_events() == live


def test_events_encode_in_map_form() -> None:
    manager = KVCacheManager(6, BS, 64, enable_kv_cache_events=True)
    admit(manager, Request("a", list(range(9)), BS))
    batch = KVEventBatch(1.0, manager.take_events(), 0)
    assert decode_event_batch(encode_event_batch(batch)) == batch
    assert decode_event_batch(encode_event_batch(batch, format="array")) == batch


def test_hashes_are_recomputed_from_the_tree_for_a_restored_state() -> None:
    manager = KVCacheManager(1600, 1, 4096)
    request = Request("long", list(range(1500)), 1)
    admit(manager, request)
    restored = BlockPool(1600, True, 1, max_blocks_per_request=4098,
                         engine=Engine(state=manager.engine.state))
    last = manager.get_block_ids("long")[0][1498]
    assert restored.blocks[last].block_hash == manager.block_pool.blocks[last].block_hash
    assert restored.get_cached_block(request.block_hashes[1498], [0]) is not None
