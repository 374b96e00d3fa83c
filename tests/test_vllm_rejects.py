"""A rejected vLLM front-end call leaves everything exactly as it was (hardening issue).

Each test snapshots the core state's fingerprint and sequence number and the
manager's own bookkeeping, makes a call that must be refused, and checks
that nothing moved: no event was committed, no request was opened, no
cursor changed.  The first three failed on the pre-port front end (it
allocated, or opened the request, before raising; it accepted token ids
outside int64, which broke ``fingerprint()`` later).
"""

from __future__ import annotations

from typing import Any

import pytest

from kvstate.invariants import check
from kvstate.vllm.manager import KVCacheBlocks, KVCacheManager
from kvstate.vllm.request import Request
from tests.listener_helpers import FailingListener
from tests.vllm_helpers import admit, ids

BS = 4


def snapshot(manager: KVCacheManager) -> tuple[Any, ...]:
    engine = manager.engine
    return (engine.view.fingerprint(), engine.seq, len(engine.events), dict(manager.running),
            dict(manager._covered), manager.block_pool.free_block_ids())


def test_allocate_past_max_model_len_is_rejected_before_any_allocation() -> None:
    manager = KVCacheManager(10, BS, 8)
    request = Request("a", list(range(20)), BS)
    before = snapshot(manager)
    with pytest.raises(ValueError, match="past max_model_len=8"):
        manager.allocate_slots(request, 20)
    assert snapshot(manager) == before and "a" not in manager.engine.view.requests
    # At the limit exactly it is fine, and one token more is refused the same way.
    assert ids(admit(manager, Request("b", list(range(8)), BS))[2]) == [1, 2]
    grown = Request("c", list(range(8)), BS)
    admit(manager, grown)
    grown.append_output_token_ids(1)
    before = snapshot(manager)
    with pytest.raises(ValueError, match="would reach 9 tokens"):
        manager.allocate_slots(grown, 1)
    assert snapshot(manager) == before


def _cached_pair(manager: KVCacheManager) -> KVCacheBlocks:
    """Cache two blocks of ``range(9)`` and return the hit a second such request gets."""
    admit(manager, Request("owner", list(range(9)), BS))
    blocks, hit, _ = manager.get_computed_blocks(Request("probe", list(range(9)), BS))
    assert hit == 8
    return blocks


@pytest.mark.parametrize("case", ["duplicate", "not cached", "other tokens", "count", "running"])
def test_bad_new_computed_blocks_leave_no_trace(case: str) -> None:
    manager = KVCacheManager(12, BS, 64)
    hits = _cached_pair(manager)
    pool = manager.block_pool
    first, second = hits.blocks[0]
    request = Request("r", list(range(9)), BS)
    count = 8
    if case == "duplicate":
        hits = KVCacheBlocks(((first, first),))
    elif case == "not cached":
        hits = KVCacheBlocks(((pool.blocks[9], second),))
    elif case == "other tokens":
        hits = KVCacheBlocks(((second, first),))
    elif case == "count":
        count = 4
    else:
        admit(manager, request)
        request.append_output_token_ids(3)
        count = 8
    before = snapshot(manager)
    with pytest.raises(ValueError):
        manager.allocate_slots(request, 1, count, hits)
    assert snapshot(manager) == before
    if case != "running":
        assert "r" not in manager.engine.view.requests  # the pre-port code left it open
    assert check(manager.engine.view) == []


@pytest.mark.parametrize("bad", [object(), "junk", [[1]], (1, 2)])
def test_hits_that_are_not_kv_cache_blocks_are_a_type_error(bad: Any) -> None:
    """Both managers refuse, before anything is read or changed, hits that are not the
    ``KVCacheBlocks`` of ``get_computed_blocks``."""
    from tools.bench_vllm import kvstate_api

    manager = KVCacheManager(10, BS, 64)
    before = snapshot(manager)
    with pytest.raises(TypeError, match="must be the KVCacheBlocks"):
        manager.allocate_slots(Request("a", list(range(9)), BS), 9, 0, bad)
    assert snapshot(manager) == before
    api = kvstate_api(None)
    hybrid = api["hybrid"](64, "full+swa+mamba")
    fingerprint, seq = hybrid.engine.view.fingerprint(), hybrid.engine.seq
    with pytest.raises(TypeError, match="must be the KVCacheBlocks"):
        hybrid.allocate_slots(api["request"]("a", list(range(30))), 30, 0, bad)
    assert (hybrid.engine.view.fingerprint(), hybrid.engine.seq) == (fingerprint, seq)
    assert hybrid.cursors == {}


@pytest.mark.parametrize("bad", [2**64, 2**63, -1])
def test_token_ids_outside_int64_are_rejected_at_the_boundary(bad: int) -> None:
    with pytest.raises(ValueError, match="outside 0..2\\*\\*63-1"):
        Request("a", [1, bad, 2], BS)
    request = Request("b", [1, 2, 3], BS)
    with pytest.raises(ValueError, match="int64"):
        request.append_output_token_ids([4, bad])
    with pytest.raises(ValueError, match="int64"):
        request.append_output_token_ids(bad)
    assert request.all_token_ids == [1, 2, 3] and request.block_hashes == []
    # The largest int64 is a token id like any other; the state still fingerprints.
    manager = KVCacheManager(6, BS, 64)
    admit(manager, Request("c", [2**63 - 1] * 9, BS))
    assert len(manager.engine.state.fingerprint()) == 16


@pytest.mark.parametrize("bad", ["x", 1.0, True, None])
def test_non_int_token_ids_are_rejected(bad: Any) -> None:
    with pytest.raises(TypeError, match="token ids must be ints"):
        Request("a", [1, bad], BS)
    request = Request("b", [1], BS)
    with pytest.raises(TypeError, match="token ids must be ints"):
        request.append_output_token_ids([bad])
    assert request.all_token_ids == [1]


def test_overlong_names_are_rejected_at_the_boundary() -> None:
    with pytest.raises(ValueError, match="cache_salt is 5000 characters"):
        Request("a", [1], BS, cache_salt="s" * 5000)
    with pytest.raises(TypeError, match="lora_name must be a str"):
        Request("a", [1], BS, lora_name=7)  # type: ignore[arg-type]


def test_a_scheduler_that_does_not_advance_num_computed_tokens_gets_an_error() -> None:
    """vLLM 0.33 returns no new blocks and carries on: the new tokens never get slots.

    (Checked against vLLM 0.33: six such decode calls on a 6-token request keep
    its table at two blocks while its tokens grow to 12.)
    """
    manager = KVCacheManager(10, BS, 64)
    request = Request("a", list(range(6)), BS)
    blocks, hit, _ = manager.get_computed_blocks(request)
    assert ids(manager.allocate_slots(request, 6, hit, blocks)) == [1, 2]
    request.append_output_token_ids(7)  # ... but num_computed_tokens stays 0
    before = snapshot(manager)
    with pytest.raises(ValueError, match="num_computed_tokens=0 but its last allocate_slots"):
        manager.allocate_slots(request, 1)
    assert snapshot(manager) == before
    request.num_computed_tokens = 6  # the scheduler's update after the step
    assert ids(manager.allocate_slots(request, 1)) == []  # token 7 fits block 2
    # A preempted request starts again from 0 once freed.
    manager.free(request)
    request.num_computed_tokens = 0
    assert admit(manager, request)[1] == 4


def test_refused_allocation_keeps_only_the_window_release() -> None:
    """vLLM frees out-of-window blocks before its capacity check; a refusal keeps that."""
    manager = KVCacheManager(6, BS, 64, sliding_window=5)
    request = Request("w", list(range(8)), BS)
    assert ids(admit(manager, request)[2]) == [1, 2]
    assert ids(admit(manager, Request("x", list(range(50, 62)), BS))[2]) == [3, 4, 5]
    request.append_output_token_ids(1)
    events = len(manager.engine.events)
    # Block 0's 4 tokens fall out of the window; 3 more blocks for 8 lookahead tokens do not fit.
    assert manager.allocate_slots(request, 1, num_lookahead_tokens=8) is None
    assert manager.get_block_ids("w")[0] == [0, 2]
    assert len(manager.engine.events) == events + 1
    assert manager.block_pool.free_block_ids() == [1]
    assert check(manager.engine.view) == []


def _serve(manager: Any, failing: bool) -> list[Any]:
    """A scheduler-like run (admissions with hits, decodes, frees); with ``failing``, a listener
    that keeps failing at commits is re-attached after each failure."""
    from kvstate.errors import ListenerError

    listener = FailingListener(3)
    trace: list[Any] = []

    def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
        if failing and listener not in manager.engine._listeners:
            manager.engine.subscribe(listener)
        try:
            return fn(*args, **kwargs)
        except ListenerError:
            assert failing
            return "listener failed"  # the call's events were applied

    live: list[Request] = []
    for index in range(40):
        request = Request(f"r{index}", [index % 3] * 8 + list(range(index, index + 5)), 4,
                          hash_seed="0")
        blocks, hit, _ = manager.get_computed_blocks(request)
        if call(manager.allocate_slots, request, request.num_tokens - hit, hit, blocks,
                full_sequence_must_fit=True) is not None:
            request.num_computed_tokens = request.num_tokens
            live.append(request)
        for running in live:
            running.append_output_token_ids(index)
            call(manager.allocate_slots, running, 1)
            running.num_computed_tokens += 1
        if len(live) > 4:
            call(manager.free, live.pop(0))
        trace.append((manager.block_pool.free_block_ids(),
                      [manager.get_block_ids(r.request_id) for r in live]))
        assert list(check(manager.engine.view)) == []
    return trace


@pytest.mark.parametrize("layout", ["full", "full+swa", "full+mamba"])
def test_a_failing_listener_leaves_the_manager_in_step_with_its_state(layout: str) -> None:
    """A listener failing at a commit raises ``ListenerError`` after the call's events are
    applied; the manager's own counters must follow those events, so the run goes on exactly
    as one without the failing listener."""
    from tests.vllm_helpers import FULL, MAMBA, SWA, hybrid_config

    def build() -> Any:
        if layout == "full":
            return KVCacheManager(64, 4, 1024, enable_kv_cache_events=True, hash_seed="0")
        specs = (FULL, SWA) if layout == "full+swa" else (FULL, MAMBA)
        return KVCacheManager(hybrid_config(*specs, num_blocks=128), 1024, 4, 4,
                              enable_kv_cache_events=True, hash_seed="0")

    assert _serve(build(), failing=True) == _serve(build(), failing=False)


def test_a_null_block_hit_inside_what_the_request_reads_is_refused() -> None:
    # Full attention reads every earlier token: a null hit would claim tokens held nowhere.
    manager = KVCacheManager(12, BS, 64)
    null = manager.block_pool.null_block
    before = snapshot(manager)
    with pytest.raises(ValueError, match="is the null block"):
        manager.allocate_slots(Request("a", list(range(10)), BS), 2, 8,
                               KVCacheBlocks(((null, null),)))
    assert snapshot(manager) == before and check(manager.engine.state) == []


@pytest.mark.parametrize("forged_id", [1.0, True, -1, 99])
def test_a_forged_block_view_is_refused_with_nothing_changed(forged_id: Any) -> None:
    from kvstate.vllm.block_pool import KVCacheBlock

    manager = KVCacheManager(12, BS, 64)
    pool = manager.block_pool
    pool.get_new_blocks(1)
    before = snapshot(manager)
    forged = KVCacheBlock(forged_id, pool.engine, pool.hashes)
    for call in (pool.free_blocks, pool.touch):
        with pytest.raises(TypeError, match="not a block of this pool"):
            call([forged])
        assert snapshot(manager) == before
    with pytest.raises(AttributeError):
        pool.blocks[1].block_id = 5  # type: ignore[misc]  # views are read-only
    assert pool.blocks[1].block_id == 1


def test_caching_a_request_hashed_with_another_seed_is_refused() -> None:
    manager = KVCacheManager(12, BS, 64, enable_kv_cache_events=True)
    request = Request("a", list(range(12)), BS)
    manager.allocate_slots(request, 8, num_lookahead_tokens=4)
    request.num_computed_tokens = 8
    manager.take_events()  # the two blocks the allocation cached
    before = snapshot(manager)
    foreign = Request("a", list(range(12)), BS, hash_seed=123)
    with pytest.raises(ValueError, match="hash_seed"):
        manager.cache_blocks(foreign, 12)
    blocks = [manager.block_pool.blocks[page] for page in manager.get_block_ids("a")[0]]
    with pytest.raises(ValueError, match="hash_seed"):
        manager.block_pool.cache_full_blocks(foreign, blocks, 2, 3, BS)
    assert snapshot(manager) == before and manager.take_events() == []
    manager.cache_blocks(request, 12)  # the request's own hashes are fine
    assert manager.block_pool.get_cached_block(request.block_hashes[2], [0]) is not None


@pytest.mark.parametrize("bad", [123, None, b"a"])
def test_free_takes_a_request_or_its_id(bad: Any) -> None:
    from tests.test_vllm_hybrid_rejects import FULL, manager, window

    for target in (KVCacheManager(12, BS, 64), manager(FULL, window(8))):
        target.allocate_slots(Request("a", list(range(8)), BS), 8)
        fingerprint = target.engine.view.fingerprint()
        with pytest.raises(TypeError, match="a Request or a request id"):
            target.free(bad)
        assert target.engine.view.fingerprint() == fingerprint
        target.free("a")
        assert check(target.engine.state) == []
