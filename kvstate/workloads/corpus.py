"""Builders for the ``replay/`` regression corpus (hand-written scenarios and damaged logs).

Each builder returns events that the current reducer accepts (they are
produced by the core itself, through the SGLang front end or the planner),
or, for the deliberately failing and malformed entries, documents exactly
what is wrong.  ``tools/make_replay_corpus.py`` writes the files and their
``.expect.json`` sidecars; the tests replay them.  Nothing here touches the
file system except :func:`write_expectation`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from kvstate.engine import Engine
from kvstate.events import Allocate, Append, Assign, Event, Free, Lock, ReqAlloc
from kvstate.planner import plan_insert, plan_match
from kvstate.planner.requests import RequestCursor, plan_release
from kvstate.sglang import RadixCache, ReqToTokenPool, TokenToKVPoolAllocator
from kvstate.state import DETACHED, Geometry


def seed_000_radix_example() -> tuple[Geometry, list[Event]]:
    """Seed 000's radix tree walk: insert, a partial match that splits, lock, unlock, evict."""
    engine = Engine(Geometry(num_pages=1))
    pool = ReqToTokenPool(size=4, max_context_len=32, engine=engine)
    allocator = TokenToKVPoolAllocator(size=32, engine=engine)
    cache = RadixCache(pool, allocator, page_size=1)
    cache.insert([1, 2, 3, 4, 5])  # one leaf
    cache.insert([1, 2, 3, 6, 7])  # splits [1,2,3] off, new leaf [6,7]
    _, node = cache.match_prefix([1, 2, 3, 6, 9])  # hits 4 tokens, splits [6,7] at 1
    cache.inc_lock_ref(node)
    cache.evict(32)  # only the unlocked leaves go
    cache.dec_lock_ref(node)
    cache.evict(2)  # now the LRU leaf goes
    return engine.geometry, list(engine.events)


def seed_001_prefix_hit() -> tuple[Geometry, list[Event]]:
    """Seed 001's walk-through: req_0's 5-token prompt hits slots [42, 17, 88], takes [5, 9].

    kvstate reserves row 0 as padding, so req_0 sits in row 1.
    """
    geometry = Geometry(num_pages=128, page_size=1, num_rows=4, row_width=64)
    engine = Engine(geometry)
    prompt = (101, 102, 103, 104, 105)
    # An earlier request left prompt[:3] cached in slots 42, 17, 88.
    engine.apply(Allocate((42, 17, 88)))
    with engine.batch() as batch:
        plan_insert(batch, prompt[:3], (42, 17, 88), DETACHED)
    row = 1
    engine.apply(ReqAlloc((row,)))
    with engine.batch() as batch:
        match = plan_match(batch, prompt[:4])
    assert match.slots == (42, 17, 88), match
    engine.apply(Lock(match.last_node))
    engine.apply(Assign(row, 0, match.slots))  # req_to_token[1][:3] = [42, 17, 88]
    engine.apply(Allocate((5, 9), ((row, (5, 9)),)))  # two new slots for tokens 4 and 5
    engine.apply(Append(((row, 5),)))
    cursor = RequestCursor(row, 3, match.last_node)
    with engine.batch() as batch:
        plan_release(batch, cursor, prompt, prompt_len=5, owned=5, checkpoint=True,
                     at_head=False)
    return geometry, list(engine.events)


def vllm_prefix_caching() -> tuple[Geometry, list[Event]]:
    """vLLM's block pool through ``kvstate.vllm``: shared prefixes, hits, lazy eviction, reset.

    Twelve blocks of 4 tokens.  Six requests share one of two 8-token stems;
    each is admitted (``get_computed_blocks`` + ``allocate_slots``), decodes
    two tokens and is freed two requests later, so later requests hit the
    cached stems and the pool reuses cached free blocks (lazy eviction).
    Ends with ``reset_prefix_cache``.
    """
    from kvstate.vllm import KVCacheManager, Request

    manager = KVCacheManager(12, 4, 64, enable_kv_cache_events=True)
    stems = ([1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15, 16])
    requests = [Request(f"r{i}", stems[i % 2] + [20 + i, 21 + i, 22 + i], 4) for i in range(6)]
    running = []
    for index, request in enumerate(requests):
        blocks, hit, _ = manager.get_computed_blocks(request)
        assert manager.allocate_slots(request, request.num_tokens - hit, hit, blocks) is not None
        request.num_computed_tokens = request.num_tokens
        for token in (90 + index, 91 + index):
            request.append_output_token_ids(token)
            assert manager.allocate_slots(request, 1) is not None
            request.num_computed_tokens = request.num_tokens
        running.append(request)
        if len(running) > 2:
            manager.free(running.pop(0))
    for request in running:
        manager.free(request)
    assert manager.reset_prefix_cache()
    return manager.engine.geometry, list(manager.engine.events)


def tiered_offload_and_load(policy: str) -> tuple[Geometry, int, list[Event]]:
    """A host-tier run: cache a prompt, evict it to the host, hit it again (loaded back).

    Returns the geometry, the host pool's pages and the events.  With
    ``write_through`` the backup is made when the prompt is inserted; with
    ``write_back`` when it is evicted.
    """
    from kvstate.planner.host import (
        plan_checkpoint_tiered,
        plan_evict_tiered,
        plan_extend_tiered,
        plan_match_tiered,
    )

    geometry = Geometry(num_pages=6, page_size=2, num_rows=4, row_width=64)
    host_pages = 8
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    engine = Engine(geometry, host_pages=host_pages)
    engine.apply(ReqAlloc((1,)))
    with engine.batch() as batch:
        plan_extend_tiered(batch, [(1, 8)], policy=policy, at_head=True)
    with engine.batch() as batch:
        cursor = plan_checkpoint_tiered(batch, RequestCursor(1), tokens, prompt_len=8, up_to=8,
                                        policy=policy, at_head=True)
    with engine.batch() as batch:
        plan_release(batch, cursor, tokens, prompt_len=8, owned=8, checkpoint=False, at_head=True)
        plan_evict_tiered(batch, 100, policy=policy, at_head=True)
    with engine.batch() as batch:
        plan_match_tiered(batch, tokens, policy=policy, at_head=True)
    return geometry, host_pages, list(engine.events)


def double_free(events: list[Event], geometry: Geometry) -> list[Event]:
    """The given valid events plus a Free of a page that is already free (refused)."""
    from kvstate.backends.persistent import apply_all
    from kvstate.state import initial_state

    state = apply_all(initial_state(geometry), events)
    page = next(iter(state.free_pages))
    return [*events, Free((page,))]


def write_expectation(path: str | os.PathLike[str], expectation: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as out:
        json.dump(expectation, out, indent=2, sort_keys=True)
        out.write("\n")
