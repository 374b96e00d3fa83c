"""The vLLM front end and the collector: no reference cycles, and the records a serving loop
keeps are not tracked (docs/design.md, "Garbage collection")."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from vllm_helpers import BS, FULL, SWA, hybrid_config

from kvstate.events import BlockAlloc
from kvstate.vllm.block_pool import BlockPool
from kvstate.vllm.kv_event_types import BlockStored
from kvstate.vllm.manager import KVCacheManager
from kvstate.vllm.request import Request


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def hybrid_manager() -> KVCacheManager:
    return KVCacheManager(hybrid_config(FULL, SWA, num_blocks=64), 1 << 10, BS, BS,
                          enable_kv_cache_events=True, hash_seed="0")


def serve(manager: KVCacheManager, rounds: int = 6) -> list[object]:
    """Admit, decode, free and drain events; the requests, blocks and events handed out."""
    handed: list[object] = []
    running: list[Request] = []
    for index in range(rounds):
        request = Request(f"r{index}", [1, 2, 3, 4, 5, 6, 7, 8] + [index] * 5, BS,
                          hash_seed="0")
        blocks, hit = manager.get_computed_blocks(request)[:2]
        new = manager.allocate_slots(request, request.num_tokens - hit, hit, blocks)
        assert new is not None
        request.num_computed_tokens = request.num_tokens
        running.append(request)
        for live in running:
            live.append_output_token_ids(index)
            handed.append(manager.allocate_slots(live, 1))
            live.num_computed_tokens += 1
        if len(running) > 3:
            manager.free(running.pop(0))
        handed.extend(manager.take_events())
    handed.extend(running)
    return handed


@pytest.mark.parametrize("make", [hybrid_manager,
                                  lambda: KVCacheManager(64, BS, 1 << 10, hash_seed="0",
                                                         enable_kv_cache_events=True)],
                         ids=["hybrid", "full"])
def test_a_dropped_manager_is_freed_without_the_cycle_collector(make, collector_off) -> None:
    serve(make())  # first use fills module-level caches
    gc.collect()
    manager = make()
    handed = serve(manager)
    engine = weakref.ref(manager.engine)
    pool = weakref.ref(manager.block_pool)
    del manager, handed
    assert engine() is None and pool() is None  # freed by reference counting alone
    assert gc.collect() == 0  # and nothing was left in a cycle


def test_records_events_and_views_are_not_tracked() -> None:
    manager = hybrid_manager()
    handed = serve(manager)
    view = manager.block_pool.blocks[1]
    assert not gc.is_tracked(view)
    live = manager.engine.view
    assert live.nodes and not any(gc.is_tracked(node) for node in live.nodes.values())
    assert live.requests and not any(gc.is_tracked(record) for record in live.requests.values())
    assert not gc.is_tracked(BlockAlloc("r", (1, 2)))
    stored = [event for event in handed if isinstance(event, BlockStored)]
    assert stored and not any(gc.is_tracked(event) for event in stored)


def test_a_view_of_another_pool_is_refused_without_a_pool_reference() -> None:
    one, other = BlockPool(8, True, BS), BlockPool(8, True, BS)
    with pytest.raises(TypeError, match="not a block of this pool"):
        one.ids_of([other.blocks[2]])
    assert one.ids_of([one.blocks[2], one.blocks[0]]) == [2]
