"""The executor on block-mode (vLLM front end) logs: index plans, integrity, ``replay --executor``."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstate import Engine, apply
from kvstate.cli import main
from kvstate.events import BlockAlloc, BlockCache, BlockHold, BlockRelease, ReqAlloc
from kvstate.executor import REPLAY_MODEL, TorchExecutor, enable_integrity, plan_indices, replay_hook
from kvstate.log import Recorder, read_events
from kvstate.log.writer import write_log
from kvstate.rules import RULES
from kvstate.state import DETACHED, Geometry, initial_state
from kvstate.vllm.block_pool import BlockPool
from kvstate.vllm.manager import KVCacheManager
from kvstate.vllm.request import Request
from tests.vllm_helpers import admit

BS = 4
MODEL_PAGES = 12


def admit_and_decode(manager: KVCacheManager, request: Request) -> bool:
    """Prefill ``request`` (prefix hits included) and take one decode token; False if no room."""
    if admit(manager, request)[2] is None:
        return False
    request.append_output_token_ids(7)
    manager.allocate_slots(request, 1)
    return True


def workload(manager: KVCacheManager) -> None:
    """Shared prefixes, frees, reuse of cached pages, evictions and a cache reset attempt."""
    requests = [Request(f"r{i}", [i % 2] * 8 + list(range(i, i + 5)), BS) for i in range(8)]
    for index, request in enumerate(requests):
        admit_and_decode(manager, request)
        if index % 2:
            manager.free(requests[index - 1])
    manager.evict_blocks({1, 2})
    for request in requests:
        if request.request_id in manager.engine.state.requests:
            manager.free(request)
    manager.reset_prefix_cache()
    admit_and_decode(manager, Request("again", [0] * 8 + [1, 2, 3], BS))


def record(tmp_path: Path, manager: KVCacheManager, run=workload) -> Path:
    path = tmp_path / "vllm.kvlog"
    with Recorder(manager, str(path)):
        run(manager)
    return path


def replay_log(path: Path, check_every: int = 1):
    header, events = read_events(str(path))
    return replay_hook((initial_state(header.geometry), list(events)), "cpu",
                       check_every=check_every)


# -- index plans ----------------------------------------------------------------------------
def block_state(num_pages: int = 6):
    state = initial_state(Geometry(num_pages=num_pages, page_size=2, num_rows=0, row_width=32,
                                   mode="block"))
    return apply(state, ReqAlloc(("a", "b")))


def step(state, event):
    return apply(state, event), plan_indices(state, event)


def test_block_plans_say_who_writes_links_nulls_and_frees():
    state = block_state()
    state, plan = step(state, BlockAlloc("a", (1, 2)))
    assert plan.new_tokens == (("a", 0, 2), ("a", 1, 3), ("a", 2, 4), ("a", 3, 5))
    assert not plan.copy_src and not plan.linked_tokens
    entries = ((1, (5, 6), None, 1), (2, (7, 8), None, 2))
    state, plan = step(state, BlockCache(0, entries))
    assert plan.cached_blocks == ((1, 0, (2, 3)), (2, 2, (4, 5)))
    state, plan = step(state, BlockHold("b", (0, 2)))
    assert plan.nulled_tokens == (("b", 0, 0), ("b", 1, 1))
    assert plan.linked_tokens == (("b", 2, 4), ("b", 3, 5))
    state, plan = step(state, BlockRelease("a", (1,)))  # a sliding-window release: page 1 stays cached
    assert plan.nulled_tokens == (("a", 0, 0), ("a", 1, 1))
    assert plan.freed_slots == ()
    state, plan = step(state, BlockAlloc(DETACHED, (3,)))
    assert plan == plan_indices(state, BlockAlloc(DETACHED, ()))  # the empty plan
    state, plan = step(state, BlockRelease(DETACHED, (3,)))
    assert plan.freed_slots == (6, 7)  # neither held nor cached any more
    state, plan = step(state, BlockRelease("a", (2,), close=True))
    assert plan.closed == ("a",) and plan.freed_slots == ()  # b still holds page 2


def test_block_plans_never_copy_bytes(tmp_path):
    manager = KVCacheManager(MODEL_PAGES, BS, 64)
    header, events = read_events(str(record(tmp_path, manager)))
    state = initial_state(header.geometry)
    for event in events:
        plan = plan_indices(state, event)
        assert not (plan.copy_src or plan.host_out_src or plan.host_in_src)
        state = apply(state, event)


# -- integrity on recorded logs -------------------------------------------------------------------
@pytest.mark.parametrize("sliding_window", [None, 6])
def test_vllm_front_end_log_replays_with_integrity(tmp_path, sliding_window):
    manager = KVCacheManager(MODEL_PAGES, BS, 64, sliding_window=sliding_window)
    path = record(tmp_path, manager)
    result = replay_log(path)
    assert result.ok, result.message
    assert result.events_applied > 20
    assert result.tokens_checked > 0
    assert "integrity ok" in result.message


def test_sliding_window_log_has_null_positions_that_read_the_padding_page(tmp_path):
    manager = KVCacheManager(MODEL_PAGES, BS, 64, sliding_window=6)

    def long_request(manager):
        request = Request("long", list(range(13)), BS)
        admit_and_decode(manager, request)
        for token in range(6):
            request.num_computed_tokens = request.num_tokens
            request.append_output_token_ids(token)
            manager.allocate_slots(request, 1)

    path = record(tmp_path, manager, long_request)
    header, events = read_events(str(path))
    engine = Engine(header.geometry)
    executor = TorchExecutor(REPLAY_MODEL, header.geometry.num_pages, header.geometry.page_size,
                             device="cpu")
    executor.attach(engine)
    monitor = enable_integrity(executor)
    for event in events:
        engine.apply(event)
        assert monitor.check().ok
    assert 0 in executor.state.requests["long"].pages  # the window dropped a block
    report = monitor.verify()
    assert report.ok, str(report)


def test_pool_level_blocks_cached_without_a_writing_request_get_fresh_tags():
    pool = BlockPool(8, True, BS)
    geometry = pool.engine.state.geometry
    executor = TorchExecutor(REPLAY_MODEL, geometry.num_pages, geometry.page_size, device="cpu",
                             poison_freed=True)
    executor.attach(pool.engine)
    monitor = enable_integrity(executor)
    blocks = pool.get_new_blocks(2)  # DETACHED: nobody writes them
    pool.cache_full_blocks(Request("p", list(range(9)), BS), blocks, 0, 2, BS)
    first, second = (block.block_id for block in blocks)
    assert monitor.slot_content[second * BS][1] == BS  # the second block starts at position 4
    pool.touch(blocks)
    pool.free_blocks(blocks)
    pool.free_blocks(blocks)  # no holder left: cached, so the bytes stay valid
    report = monitor.verify()
    assert report.ok, str(report)
    assert report.tokens_checked == 2 * BS * REPLAY_MODEL.num_layers
    pool.evict_blocks([first, second])  # uncached and unheld: now garbage (poisoned)
    assert torch.isnan(executor.k_buffer[0][first * BS]).all()
    assert monitor.verify().ok


def test_cli_replay_with_the_cpu_executor_on_a_block_log(tmp_path, capsys):
    path = record(tmp_path, KVCacheManager(MODEL_PAGES, BS, 64))
    assert main(["replay", str(path), "--executor", "cpu"]) == 0
    assert "FAILED" not in capsys.readouterr().err


# -- corruption is caught ---------------------------------------------------------------------------
def test_a_cache_hit_on_the_wrong_block_is_caught(tmp_path, capsys):
    """Tamper one prefix hit so that it maps a cached block of another chain position."""
    manager = KVCacheManager(MODEL_PAGES, BS, 64)

    def run(manager):
        admit_and_decode(manager, Request("x", list(range(13)), BS))
        admit_and_decode(manager, Request("y", list(range(13)), BS))

    header, events = read_events(str(record(tmp_path, manager, run)))
    events = list(events)
    hits = [i for i, e in enumerate(events) if isinstance(e, BlockHold) and e.holder == "y"]
    assert hits and len(events[hits[0]].pages) >= 2
    hold = events[hits[0]]
    events[hits[0]] = msgspec.structs.replace(hold, pages=tuple(reversed(hold.pages)))  # 0, 1 swapped
    result = replay_hook((initial_state(header.geometry), events), "cpu")
    assert not result.ok
    assert "computed for position" in result.message
    bad_log = tmp_path / "bad.kvlog"
    write_log(bad_log, header.geometry, events)
    assert main(["replay", str(bad_log), "--check-every", "0", "--executor", "cpu"]) == 1
    assert "executor" in capsys.readouterr().err


def test_a_refcount_aliasing_bug_is_caught(tmp_path, monkeypatch):
    """A release that frees pages other requests still hold, so a new request can take them.

    The state forgets that ``second`` holds them; the monitor does not, so the
    check after the eviction that frees them reports the use after free
    (before ``third`` even writes over them).
    """
    original = RULES[BlockRelease]

    def leaky_release(s, event):
        shared = [page for page in event.pages if page and len(s.holders.get(page, ())) > 1]
        original(s, event)
        for page in shared:  # the bug: queued as free although others still hold them
            del s.holders[page]
            s.free_pages = s.free_pages.push_head([page])

    monkeypatch.setitem(RULES, BlockRelease, leaky_release)
    manager = KVCacheManager(MODEL_PAGES, BS, 64)

    def run(manager):
        first = Request("first", [1] * 8 + [2], BS)
        second = Request("second", [1] * 8 + [3], BS)
        admit_and_decode(manager, first)
        admit_and_decode(manager, second)  # hits the two cached blocks of ``first``
        manager.free(first)  # the bug queues the shared blocks as free
        admit_and_decode(manager, Request("third", [9] * 8 + [4], BS))  # and this one takes them

    result = replay_log(record(tmp_path, manager, run))
    assert not result.ok
    assert "use after free: request 'second' position 0" in result.message


# -- random front-end workloads --------------------------------------------------------------------
ACTIONS = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(1, 9)),
                   min_size=1, max_size=14)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=ACTIONS, sliding_window=st.sampled_from([None, 6]))
def test_random_vllm_workloads_keep_integrity_with_poisoned_frees(actions, sliding_window):
    """Admit / decode / free / evict at random; freed pages are poisoned, live ones must survive."""
    manager = KVCacheManager(MODEL_PAGES, BS, 64, sliding_window=sliding_window)
    geometry = manager.engine.state.geometry
    executor = TorchExecutor(REPLAY_MODEL, geometry.num_pages, geometry.page_size, device="cpu",
                             poison_freed=True)
    executor.attach(manager.engine)
    monitor = enable_integrity(executor)
    running: list[Request] = []
    for serial, (action, prefix, tail) in enumerate(actions):
        if action <= 1:
            request = Request(f"q{serial}", [prefix] * 8 + list(range(tail)), BS)
            if admit_and_decode(manager, request):
                running.append(request)
        elif action == 2 and running:
            request = running[tail % len(running)]
            request.num_computed_tokens = request.num_tokens
            request.append_output_token_ids(tail)
            if manager.allocate_slots(request, 1) is None:
                manager.free(request)
                running.remove(request)
        elif running:
            manager.free(running.pop(tail % len(running)))
            manager.evict_blocks({tail})
        check = monitor.check()
        assert check.ok, str(check)
        report = monitor.verify()
        assert report.ok, str(report)
