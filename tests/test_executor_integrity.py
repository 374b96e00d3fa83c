"""The executor as an engine listener; dangling entries; the incremental integrity check."""

from __future__ import annotations

import pytest
import torch

from kvstate import Engine, Geometry, ModelConfig
from kvstate.errors import InvalidEvent
from kvstate.events import (
    Allocate,
    Copy,
    Free,
    FreeMapped,
    Insert,
    ReqAlloc,
    ReqFree,
    Share,
    SwaAdopt,
    SwaAlloc,
    SwaEvict,
    Truncate,
)
from kvstate.executor import (
    TorchExecutor,
    UseAfterFree,
    enable_integrity,
    flashinfer_page_table,
    gather_kv,
    sglang_req_to_token,
    vllm_block_table,
    vllm_slot_mapping,
)
from kvstate.executor import plan as plan_module
from kvstate.executor.index_plan import IndexPlan
from kvstate.planner.alloc import plan_extend
from kvstate.planner.host import plan_backup, plan_evict_tiered, plan_match_tiered
from kvstate.planner.requests import RequestCursor, plan_checkpoint, plan_release
from kvstate.sglang import PagedTokenToKVPoolAllocator, ReqToTokenPool
from kvstate.state import initial_state

CONFIG = ModelConfig(num_layers=2, num_kv_heads=2, head_dim=8)


def make(num_pages=16, page_size=2, host_pages=0, poison=True):
    engine = Engine(Geometry(num_pages=num_pages, page_size=page_size, num_rows=6, row_width=64),
                    host_pages=host_pages)
    executor = TorchExecutor(CONFIG, num_pages, page_size, device="cpu", poison_freed=poison)
    executor.attach(engine)
    return engine, executor, enable_integrity(executor)


def decide(engine, planner, *args, **kwargs):
    with engine.batch() as batch:
        return planner(batch, *args, **kwargs)


def smuggle(executor, event):
    """A buggy core: the executor plans and moves ``event``, the engine never applies it."""
    executor.before(event, executor.view)
    executor.after([event], executor.view)


# -- the listener ------------------------------------------------------------------------
def test_a_batch_moves_its_bytes_in_event_order_once_committed():
    engine, executor, _ = make()
    engine.apply(Allocate((1, 2)))
    data = torch.randn(2, 2, 8).half()
    executor.set_kv_buffer(0, [2, 3], data, data)
    with engine.batch() as batch:
        batch.emit(Copy((1,), (2,)))
        batch.emit(Free((1,)))
        assert not torch.isnan(executor.k_buffer[0][2:4]).any()  # nothing moves mid-batch
    assert torch.equal(executor.k_buffer[0][4:6], data)  # copied before page 1 was poisoned
    assert torch.isnan(executor.k_buffer[0][2:4]).all()


def test_a_refused_event_and_a_rolled_back_batch_move_nothing():
    engine, executor, monitor = make()
    engine.apply(Allocate((1, 2)))
    with pytest.raises(InvalidEvent, match="double free"):
        engine.apply(Free((3,)))
    assert executor._pending == []  # the refused event's plan was discarded
    with pytest.raises(RuntimeError, match="changed my mind"), engine.batch() as batch:
        batch.emit(Free((1,)))
        raise RuntimeError("changed my mind")
    assert executor._pending == []  # the engine said the batch was undone
    assert not torch.isnan(executor.k_buffer[0][2:4]).any()  # the rolled-back free moved nothing
    engine.apply(Free((2,)))  # the next batch lines up with its own plans
    assert torch.isnan(executor.k_buffer[0][4:6]).all() and not torch.isnan(executor.k_buffer[0][2:4]).any()
    assert monitor.check().ok and monitor.verify().ok


def test_attach_once_detach_and_follow_no_engine():
    engine, executor, _ = make()
    with pytest.raises(RuntimeError, match="already follows"):
        executor.attach(Engine(Geometry(num_pages=16, page_size=2)))
    executor.detach()
    engine.apply(Allocate((1,)))
    engine.apply(Free((1,)))
    assert not torch.isnan(executor.k_buffer[0][2:4]).any()  # detached: nothing followed
    with pytest.raises(RuntimeError, match="follows no engine"):
        _ = executor.view


# -- dangling entries (FreeMapped) ----------------------------------------------------------
def sglang_row_with_a_dangling_page():
    """A row of 6 tokens whose last page SGLang's allocator freed under it."""
    pool = ReqToTokenPool(size=4, max_context_len=32)
    executor = TorchExecutor(CONFIG, 8, 2, device="cpu", poison_freed=True)
    allocator = PagedTokenToKVPoolAllocator(size=16, page_size=2, kvcache=executor)
    monitor = enable_integrity(executor, request_pool=pool)
    row = pool.alloc(1)[0]
    slots = allocator.alloc_extend([0], [6], [-1], 6)
    pool.write((row, slice(0, 6)), slots)
    allocator.free(slots[4:6])
    assert isinstance(pool.engine.events[-1], FreeMapped)
    return pool, allocator, executor, monitor, row, slots.tolist()


def test_every_export_refuses_a_dangling_entry_as_a_use_after_free():
    pool, _, executor, _, row, slots = sglang_row_with_a_dangling_page()
    state = pool.engine.state
    assert state.requests[row].dangling == (2,)
    for read in (lambda: gather_kv(executor, state, row, 0),
                 lambda: flashinfer_page_table(state, [row]),
                 lambda: vllm_block_table(state, [row]),
                 lambda: sglang_req_to_token(state, [row]),
                 lambda: vllm_slot_mapping(state, [(row, 3, 6)]),
                 lambda: gather_kv(executor, pool.engine.view, row, 1)):  # the live view too
        with pytest.raises(UseAfterFree, match="use after free") as caught:
            read()
        assert caught.value.request == row and caught.value.positions == range(4, 6)
        assert caught.value.page == slots[4] // 2
    assert vllm_slot_mapping(state, [(row, 0, 4)]).tolist() == slots[:4]  # live span: fine


def test_dangling_entries_are_not_read_by_checks_but_a_kernel_read_is_reported():
    pool, _, executor, monitor, row, slots = sglang_row_with_a_dangling_page()
    assert monitor.check().ok
    report = monitor.verify()
    # 4 live tokens, 2 layers, read through the slot mapping and the pool's own table
    assert report.ok and report.tokens_checked == 4 * 2 * 2, str(report)
    assert torch.isnan(executor.k_buffer[0][slots[4]]).all()  # the freed slot is poisoned
    table = pool.req_to_token[row, :6]  # SGLang's own row still maps the freed slots
    assert table.tolist() == slots
    kernel = monitor.check_read(row, table)
    assert not kernel.ok
    assert f"use after free: request {row} position 4 reads slot {slots[4]}" in str(kernel)
    assert monitor.check_read(row, table[:4]).ok
    # The monitor keeps its own record: a state that lost the mark is still caught.
    state = pool.engine.state
    forgot = state.with_changes(requests=state.requests.set(row, state.requests[row]._replace(
        dangling=())))
    assert "use after free" in str(monitor.check_read(row, table, state=forgot))


def test_a_dangling_page_taken_by_another_row_is_still_a_use_after_free():
    pool, allocator, executor, monitor, row, slots = sglang_row_with_a_dangling_page()
    other = pool.alloc(1)[0]
    taken = allocator.alloc_extend([0], [2], [-1], 2)
    assert taken.tolist() == slots[4:6]  # the freed page, reused at once
    pool.write((other, slice(0, 2)), taken)
    assert monitor.check().ok and monitor.verify().ok
    with pytest.raises(UseAfterFree):
        sglang_req_to_token(pool.engine.state, [row, other])
    assert "use after free" in str(monitor.check_read(row, pool.req_to_token[row, :6]))


@pytest.mark.parametrize("resolve", ["rewrite", "truncate", "close"])
def test_rewriting_truncating_or_closing_the_row_ends_the_dangling(resolve):
    pool, allocator, executor, monitor, row, slots = sglang_row_with_a_dangling_page()
    if resolve == "rewrite":
        fresh = allocator.alloc(2)
        pool.write((row, slice(4, 6)), fresh)  # fresh KV for positions 4 and 5
    elif resolve == "truncate":
        pool.engine.apply(Truncate(row, 4))
    else:
        pool.free(row)
    state = pool.engine.state
    rows = [row] if row in state.requests else []
    assert sglang_req_to_token(state, rows).shape[0] == len(rows)  # no use after free any more
    assert monitor.check().ok
    report = monitor.verify()
    assert report.ok, str(report)


def test_a_live_position_next_to_a_dangling_one_is_still_verified():
    pool, _, executor, monitor, row, slots = sglang_row_with_a_dangling_page()
    executor.set_kv_buffer(1, [slots[1]], torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))
    report = monitor.verify()
    assert not report.ok and f"request {row} position 1 reads another token's tag" in str(report)


# -- the incremental check ----------------------------------------------------------------
def two_requests(engine):
    engine.apply(ReqAlloc((1, 2)))
    decide(engine, plan_extend, [(1, 5), (2, 3)], at_head=True)


def test_a_check_with_nothing_changed_reads_nothing():
    engine, _, monitor = make()
    two_requests(engine)
    assert monitor.check().ok
    again = monitor.check()
    assert again.ok and again.tokens_checked == 0
    assert monitor.verify().tokens_checked > 0  # the full verification is always available


def test_a_wrong_copy_is_caught_by_the_next_check(monkeypatch):
    engine, executor, monitor = make()
    two_requests(engine)
    source = engine.state.requests[1].pages[0]
    wrong = engine.state.requests[2].pages[0]
    copy = executor.copy_slots
    monkeypatch.setattr(executor, "copy_slots",
                        lambda src, dst: copy([wrong * 2 + k for k in range(2)], dst))
    fresh = engine.state.free_pages.head(1)[0]
    engine.apply(Allocate((fresh,)))
    engine.apply(Copy((source,), (fresh,)))
    report = monitor.check()
    assert not report.ok
    assert f"slot {fresh * 2} does not hold what was copied, loaded or poisoned there" in str(report)


def test_a_missed_poisoning_is_caught_by_the_next_check(monkeypatch):
    engine, executor, monitor = make()
    engine.apply(Allocate((3,)))
    executor.set_kv_buffer(0, [6, 7], torch.ones(2, 2, 8), torch.ones(2, 2, 8))
    monkeypatch.setattr(executor, "poison_slots", lambda slots: None)
    engine.apply(Free((3,)))
    report = monitor.check()
    assert not report.ok and "freed page 3 is not poisoned" in str(report)


def test_a_page_freed_under_a_reader_is_a_use_after_free_at_once():
    engine, executor, monitor = make()
    two_requests(engine)
    page = engine.state.requests[1].pages[1]
    smuggle(executor, Free((page,)))  # a core that frees a page request 1 still holds
    report = monitor.check()
    assert not report.ok
    assert f"use after free: request 1 position 2 maps slot {page * 2}" in str(report)


def test_plans_that_disagree_with_the_rules_are_reported(monkeypatch):
    engine, _, monitor = make()
    engine.apply(ReqAlloc((1,)))

    def shifted(before, event):  # a planner that puts the tokens one page further on
        plan = plan_module._allocate(before, event)
        return IndexPlan(new_tokens=tuple((r, p, s + 2) for r, p, s in plan.new_tokens))

    monkeypatch.setitem(plan_module.PLANNERS, Allocate, shifted)
    decide(engine, plan_extend, [(1, 2)], at_head=True)
    report = monitor.check()
    assert not report.ok and "request 1 table index 0" in str(report)


def test_an_error_found_at_an_event_is_reported_once_by_checks_and_always_by_verify():
    engine, _, monitor = make()
    two_requests(engine)
    slots = engine.state.slots_of(1)
    engine.apply(ReqAlloc((3,)))
    engine.apply(Share(3, 0, tuple(slots[2:4])))  # request 1's positions 2-3 as 3's 0-1
    first = monitor.check()
    assert not first.ok and "computed for position 2" in str(first)
    assert monitor.check().ok
    assert "computed for position 2" in str(monitor.verify())


def test_host_copies_are_read_back_when_written_and_after_a_load():
    engine, executor, monitor = make(num_pages=6, host_pages=8)
    assert executor.host_pool is not None and executor.host_pool.num_pages == 8
    engine.apply(ReqAlloc((1,)))
    decide(engine, plan_extend, [(1, 4)], at_head=True)
    tokens = [1, 2, 3, 4]
    cursor = decide(engine, plan_checkpoint, RequestCursor(1), tokens, prompt_len=4, up_to=4,
                    at_head=True)
    decide(engine, plan_release, cursor, tokens, prompt_len=4, owned=4, checkpoint=False,
           at_head=True)
    node = cursor.last_node
    assert monitor.check().ok
    assert decide(engine, plan_backup, node)
    offloaded = monitor.check()
    assert offloaded.ok and offloaded.tokens_checked == 4 * 2, str(offloaded)
    decide(engine, plan_evict_tiered, 4, policy="write_back", at_head=True)
    assert node in engine.state.host.evicted
    match = decide(engine, plan_match_tiered, tokens, policy="write_back", at_head=True)
    assert match.length == 4
    loaded = monitor.check()
    assert loaded.ok and loaded.tokens_checked > 0, str(loaded)
    host_slot = engine.state.host.backup[node][0] * 2
    executor.host_pool.page_views.tensors[0][:, host_slot] = 0  # corrupt the host copy
    assert "a host copy does not read back" in str(monitor.verify())


@pytest.mark.parametrize("page", [2, 3])
def test_an_swa_adoption_moves_the_node_onto_its_owners_kv(page):
    """SGLang's hybrid SWA cache recovers a tombstone with a request's fresh FULL pages.

    Page 2 holds request 2's positions 0-1, the node's; page 3 its positions
    2-3, which the rules cannot tell from the right ones.
    """
    geometry = Geometry(num_pages=8, page_size=2, num_rows=4, row_width=64)
    engine = Engine(state=initial_state(geometry, swa_pages=8))
    executor = TorchExecutor(CONFIG, 8, 2, device="cpu", poison_freed=True)
    executor.attach(engine)
    monitor = enable_integrity(executor)
    for event in (ReqAlloc((1,)), Allocate((1,), ((1, (2, 3)),)), SwaAlloc(((1, 1),)),
                  Insert(0, (5, 6), (2, 3), 1, 1, 1), ReqFree((1,)), SwaEvict((1,)),
                  ReqAlloc((2,)), Allocate((2, 3), ((2, (4, 5, 6, 7)),)),
                  SwaAlloc(((2, 2), (3, 3)))):
        engine.apply(event)
    assert monitor.check().ok
    engine.apply(SwaAdopt(1, (page,), 2, 2))
    assert engine.state.nodes[1].pages == (page,)
    assert torch.isnan(executor.k_buffer[0][2:4]).all()  # the node's old page was freed
    report = monitor.check()
    if page == 2:
        assert report.ok and monitor.verify().ok, str(report)
        assert monitor.node_content[1] == monitor.req_content[2][:2]
    else:
        assert "tree node 1 adopts slot 6 as position 0" in str(report)


def tiered_history(engine):
    """A prompt cached, backed up, evicted to the host; a second prompt cached and backed up."""
    for row, tokens in ((1, [1, 2, 3, 4]), (2, [7, 8])):
        engine.apply(ReqAlloc((row,)))
        decide(engine, plan_extend, [(row, len(tokens))], at_head=True)
        cursor = decide(engine, plan_checkpoint, RequestCursor(row), tokens,
                        prompt_len=len(tokens), up_to=len(tokens), at_head=True)
        decide(engine, plan_release, cursor, tokens, prompt_len=len(tokens), owned=len(tokens),
               checkpoint=False, at_head=True)
        assert decide(engine, plan_backup, cursor.last_node)
        if row == 1:
            decide(engine, plan_evict_tiered, 4, policy="write_back", at_head=True)
    return engine.state


def test_attaching_to_a_tiered_state_tags_its_host_copies_too():
    engine, _, _ = make(num_pages=6, host_pages=8)
    state = tiered_history(engine)
    assert state.host.evicted and len(state.host.backup) == 2  # one host-only, one on both
    later = Engine(state=state)
    executor = TorchExecutor(CONFIG, 6, 2, device="cpu", poison_freed=True)
    executor.attach(later)
    monitor = enable_integrity(executor)
    assert monitor.verify().ok
    match = decide(later, plan_match_tiered, [1, 2, 3, 4], policy="write_back", at_head=True)
    assert match.length == 4  # loaded back from the host copy the seeding tagged
    assert monitor.check().ok and monitor.verify().ok


def test_k_and_v_of_different_widths_are_tagged_and_checked_apart():
    config = ModelConfig(num_layers=2, num_kv_heads=2, head_dim=8, v_head_dim=4)
    engine = Engine(Geometry(num_pages=16, page_size=2, num_rows=6, row_width=64))
    executor = TorchExecutor(config, 16, 2, device="cpu", poison_freed=True)
    executor.attach(engine)
    monitor = enable_integrity(executor)
    assert len(monitor.layout.groups) == 2  # K and V are two allocations
    two_requests(engine)
    spare = engine.state.free_pages.head(1)[0]
    engine.apply(Allocate((spare,)))
    engine.apply(Free((spare,)))  # poisoned and read back in both allocations
    assert monitor.check().ok and monitor.verify().ok
    slot = engine.state.slots_of(2)[1]
    executor.v_buffer[1][slot] = 0  # one V row of one layer
    assert "request 2 position 1 reads another token's tag" in str(monitor.verify())


def test_the_torch_paths_used_off_the_cpu_agree_with_the_numpy_ones():
    """On CUDA the tags and fills go through torch ops; force those paths on CPU tensors."""
    engine, executor, monitor = make()
    for group in monitor.layout.groups:
        group.array = None  # read, write and poison checks through torch
    executor.page_views._arrays = (None,) * len(executor.page_views._arrays)  # fills through torch
    two_requests(engine)
    page = engine.state.requests[2].pages[0]
    engine.apply(ReqAlloc((3,)))
    fresh = engine.state.free_pages.head(1)[0]
    engine.apply(Allocate((fresh,)))
    engine.apply(Copy((page,), (fresh,)))
    engine.apply(Free((fresh,)))
    assert torch.isnan(executor.k_buffer[1][fresh * 2]).all()
    report = monitor.check()
    assert report.ok and report.tokens_checked > 0, str(report)
    assert monitor.verify().ok
    executor.k_buffer[0][page * 2] = 0
    assert "request 2 position 0 reads another token's tag" in str(monitor.verify())
