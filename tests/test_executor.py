"""The torch executor: buffers, set/get, copies, exports, integrity and paged attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvstate import Engine, Geometry, ModelConfig
from kvstate.errors import InvalidEvent
from kvstate.events import Allocate, Assign, Copy, Free, ReqAlloc, ReqFree, Share
from kvstate.executor import (
    MLAConfig,
    MLATorchExecutor,
    TorchExecutor,
    enable_integrity,
    flashinfer_page_table,
    plan_indices,
    replay_hook,
    sglang_req_to_token,
    vllm_block_table,
    vllm_slot_mapping,
)
from kvstate.executor.integrity import tag_values
from kvstate.planner.alloc import plan_decode, plan_extend
from kvstate.planner.evict import plan_evict
from kvstate.planner.requests import RequestCursor, plan_checkpoint, plan_release
from kvstate.planner.tree_ops import plan_match

CONFIG = ModelConfig(num_layers=2, num_kv_heads=2, head_dim=8)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def make(num_pages=16, page_size=2, rows=6, device="cpu", config=CONFIG):
    engine = Engine(Geometry(num_pages=num_pages, page_size=page_size, num_rows=rows, row_width=64))
    executor = TorchExecutor(config, num_pages, page_size, device=device)
    executor.attach(engine)
    return engine, executor


def decide(engine, planner, *args, **kwargs):
    """Run a planner decision in one engine batch; its result."""
    with engine.batch() as batch:
        return planner(batch, *args, **kwargs)


def smuggle(executor, event):
    """Feed ``event`` to the executor as a buggy core would: planned and moved, never applied.

    The executor and its monitor follow it; the engine's state does not, which
    is what an aliasing or use-after-free bug in the rules looks like to them.
    """
    executor.before(event, executor.view)
    executor.after([event], executor.view)


# -- buffers -----------------------------------------------------------------------
def test_buffer_shapes_and_bytes_match_capacity_planning():
    config = ModelConfig(num_layers=3, num_kv_heads=4, head_dim=16, v_head_dim=8)
    executor = TorchExecutor(config, num_pages=10, page_size=4, device="cpu")
    assert executor.k_buffer[0].shape == (44, 4, 16)
    assert executor.v_buffer[2].shape == (44, 4, 8)
    assert len(executor.k_buffer) == 3
    assert executor.nbytes == config.bytes_per_token * 44 == 3 * 44 * 4 * (16 + 8) * 2
    assert executor.usable_bytes == config.bytes_per_page(4) * 10
    assert executor.k_buffer[1].data_ptr() == executor._k[1].data_ptr()


def test_dtype_must_match_planned_element_size():
    with pytest.raises(ValueError, match="bytes per element"):
        TorchExecutor(CONFIG, 4, 2, dtype=torch.float32, device="cpu")
    fp32 = ModelConfig(num_layers=1, num_kv_heads=1, head_dim=4, dtype_bytes=4)
    assert TorchExecutor(fp32, 4, 2, dtype=torch.float32, device="cpu").nbytes == 4 * 10 * 2 * 4


def test_default_device_is_cpu_without_cuda():
    executor = TorchExecutor(CONFIG, 2, 1)
    assert executor.device.type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_set_and_get_kv_buffer_roundtrip():
    executor = TorchExecutor(CONFIG, 4, 2, device="cpu")
    k = torch.arange(3 * 16, dtype=torch.float16).view(3, 2, 8)
    v = -k
    executor.set_kv_buffer(1, torch.tensor([3, 5, 9]), k, v)
    key, value = executor.get_kv_buffer(1)
    assert torch.equal(key[[3, 5, 9]], k)
    assert torch.equal(value[[3, 5, 9]], v)
    assert torch.count_nonzero(executor.get_key_buffer(0)) == 0
    assert executor.get_value_buffer(1) is executor.v_buffer[1]


def test_set_kv_buffer_rejects_out_of_range_slots():
    executor = TorchExecutor(CONFIG, 4, 2, device="cpu")
    with pytest.raises(IndexError, match="slot index"):
        executor.set_kv_buffer(0, [10], torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))


def test_layer_object_with_layer_id_is_accepted():
    executor = TorchExecutor(CONFIG, 4, 2, device="cpu")

    class Layer:
        layer_id = 1

    executor.set_kv_buffer(Layer(), [2], torch.ones(1, 2, 8), torch.ones(1, 2, 8))
    assert executor.k_buffer[1][2].sum() == 16


def test_mla_buffers():
    config = MLAConfig(num_layers=2, kv_lora_rank=16, qk_rope_head_dim=4)
    executor = MLATorchExecutor(config, num_pages=5, page_size=2, device="cpu")
    assert executor.kv_buffer[0].shape == (12, 20)
    assert executor.nbytes == 2 * 12 * 20 * 2
    row = torch.arange(20, dtype=torch.float16).view(1, 20)
    executor.set_kv_buffer(0, [4], row)
    assert torch.equal(executor.get_key_buffer(0)[4], row[0])
    assert torch.equal(executor.get_value_buffer(0)[4], row[0, :16])


# -- copies and the index plan ----------------------------------------------------------
def test_copy_event_copies_whole_pages_in_every_layer():
    engine, executor = make()
    engine.apply(Allocate((1, 2)))
    data = torch.randn(2, 2, 8).half()
    for layer in range(2):
        executor.set_kv_buffer(layer, [2, 3], data * (layer + 1), -data)
    engine.apply(Copy((1,), (2,)))  # wrong way round would be a no-op check; use fresh pages below
    engine.apply(Allocate((3,)))
    engine.apply(Copy((2,), (3,)))
    for layer in range(2):
        assert torch.equal(executor.k_buffer[layer][6:8], executor.k_buffer[layer][4:6])
        assert torch.equal(executor.v_buffer[layer][6:8], -data)


def test_plan_is_plain_index_lists_from_the_state_before():
    engine, _ = make()
    assert plan_indices(engine.state, ReqAlloc((1,))).opened == (1,)
    engine.apply(ReqAlloc((1,)))
    event = Allocate((1, 2), ((1, (2, 3, 4)),))
    plan = plan_indices(engine.state, event)
    assert plan.new_tokens == ((1, 0, 2), (1, 1, 3), (1, 2, 4))
    assert plan_indices(engine.view, event) == plan  # the live view plans the same
    engine.apply(event)
    engine.apply(Allocate((5,)))
    assert plan_indices(engine.state, Copy((1,), (5,))).copy_dst == (10, 11)
    assert plan_indices(engine.state, Free((5,))).freed_slots == (10, 11)


def test_poisoned_freed_slots_read_nan():
    engine = Engine(Geometry(num_pages=4, page_size=2))
    executor = TorchExecutor(CONFIG, 4, 2, device="cpu", poison_freed=True)
    executor.attach(engine)
    engine.apply(Allocate((1, 2)))
    executor.set_kv_buffer(0, [2, 3, 4, 5], torch.ones(4, 2, 8), torch.ones(4, 2, 8))
    engine.apply(Free((1,)))
    assert torch.isnan(executor.k_buffer[0][2:4]).all()
    assert not torch.isnan(executor.k_buffer[0][4:6]).any()


def test_attach_refuses_a_pool_of_another_size():
    engine = Engine(Geometry(num_pages=8, page_size=2))
    with pytest.raises(ValueError, match="8 pages"):
        TorchExecutor(CONFIG, 4, 2, device="cpu").attach(engine)


def test_sglang_allocator_attaches_kvcache():
    from kvstate.sglang import PagedTokenToKVPoolAllocator

    executor = TorchExecutor(CONFIG, 8, 2, device="cpu")
    allocator = PagedTokenToKVPoolAllocator(size=16, page_size=2, kvcache=executor)
    assert allocator.get_kvcache() is executor
    slots = allocator.alloc(4)
    assert executor.engine is allocator.engine and executor.view is allocator.engine.view
    assert slots is not None and executor.state.holders[int(slots[0]) // 2] == (0,)


# -- exports ---------------------------------------------------------------------------
def _three_requests():
    engine, executor = make(num_pages=16, page_size=4)
    engine.apply(ReqAlloc((1, 2, 3)))
    decide(engine, plan_extend, [(1, 5), (2, 8), (3, 1)], at_head=True)
    return engine, executor


def test_flashinfer_page_table_format():
    engine, _ = _three_requests()
    state = engine.state
    indptr, indices, last = flashinfer_page_table(state, [1, 2, 3])
    assert indptr.tolist() == [0, 2, 4, 5]
    assert indices.tolist() == list(state.requests[1].pages) + list(state.requests[2].pages) + [
        state.requests[3].pages[0]]
    assert last.tolist() == [1, 4, 1]
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32


def test_vllm_and_sglang_tables():
    engine, _ = _three_requests()
    state = engine.state
    table = vllm_block_table(state, [1, 2, 3])
    assert table.shape == (3, 2)
    assert table[2].tolist() == [state.requests[3].pages[0], 0]
    mapping = vllm_slot_mapping(state, [(1, 4, 5), (3, 0, 1)])
    assert mapping.tolist() == [state.slots_of(1)[4], state.slots_of(3)[0]]
    rows = sglang_req_to_token(state, [2, 1], width=10)
    assert rows[0, :8].tolist() == state.slots_of(2)
    assert rows[1, 5:].tolist() == [0] * 5
    with pytest.raises(ValueError, match="outside"):
        vllm_slot_mapping(state, [(1, 0, 6)])
    with pytest.raises(KeyError):
        sglang_req_to_token(state, [9])


def test_exports_read_a_frozen_state_and_the_live_view_alike():
    engine, executor = _three_requests()
    frozen, live = engine.state, engine.view
    assert isinstance(live.requests[1].pages, list) and isinstance(frozen.requests[1].pages, tuple)
    for a, b in zip(flashinfer_page_table(frozen, [1, 2, 3]), flashinfer_page_table(live, [1, 2, 3]),
                    strict=True):
        assert torch.equal(a, b)
    assert torch.equal(vllm_block_table(frozen, [3, 1]), vllm_block_table(live, [3, 1]))
    assert torch.equal(vllm_slot_mapping(frozen, [(2, 1, 7)]), vllm_slot_mapping(live, [(2, 1, 7)]))
    assert torch.equal(sglang_req_to_token(frozen, [2]), sglang_req_to_token(live, [2]))
    assert torch.equal(executor.gather_kv(frozen, 2, 1)[0], executor.gather_kv(live, 2, 1)[0])


def test_gather_kv_is_contiguous_in_token_order():
    engine, executor = _three_requests()
    state = engine.state
    slots = state.slots_of(2)
    k = torch.randn(8, 2, 8).half()
    executor.set_kv_buffer(0, slots, k, 2 * k)
    got_k, got_v = executor.gather_kv(state, 2, 0)
    assert got_k.is_contiguous() and torch.equal(got_k, k) and torch.equal(got_v, 2 * k)
    assert executor.gather_kv(state, 1, 0)[0].shape == (5, 2, 8)


def _dense_attention(q, k, v):
    """Decode attention of one query over contiguous K/V, with grouped KV heads (fp32)."""
    groups = q.shape[0] // k.shape[1]
    keys = k.float().repeat_interleave(groups, dim=1).transpose(0, 1)  # [Hq, T, D]
    values = v.float().repeat_interleave(groups, dim=1).transpose(0, 1)
    return F.scaled_dot_product_attention(q.float()[:, None, :], keys, values)[:, 0, :]


@pytest.mark.parametrize("device", DEVICES)
def test_paged_attention_through_every_export_equals_dense(device):
    engine, executor = make(num_pages=24, page_size=4, device=device)
    engine.apply(ReqAlloc((1, 2, 3)))
    decide(engine, plan_extend, [(1, 7), (2, 13), (3, 4)], at_head=True)
    state = engine.state
    requests, dense = [1, 2, 3], {}
    generator = torch.Generator().manual_seed(0)
    for request in requests:
        n = state.requests[request].allocated
        k = torch.randn(n, 2, 8, generator=generator).half()
        v = torch.randn(n, 2, 8, generator=generator).half()
        executor.set_kv_buffer(0, state.slots_of(request), k.to(device), v.to(device))
        dense[request] = (k.to(device), v.to(device))
    queries = {r: torch.randn(4, 8, generator=generator).to(device) for r in requests}
    lengths = [state.requests[r].allocated for r in requests]
    k_buf, v_buf = executor.get_kv_buffer(0)
    size = state.geometry.page_size
    paged_k, paged_v = k_buf.view(-1, size, 2, 8), v_buf.view(-1, size, 2, 8)
    indptr, indices, last = flashinfer_page_table(state, requests, device=device)
    block_table = vllm_block_table(state, requests, device=device)
    rows = sglang_req_to_token(state, requests, device=device)
    for i, request in enumerate(requests):
        want = _dense_attention(queries[request], *dense[request])
        pages = indices[indptr[i]:indptr[i + 1]].long()
        n = (len(pages) - 1) * size + int(last[i])
        via_flashinfer = (paged_k[pages].reshape(-1, 2, 8)[:n], paged_v[pages].reshape(-1, 2, 8)[:n])
        positions = torch.arange(lengths[i], device=device)
        blocks = block_table[i].long()[positions // size]
        vllm_slots = blocks * size + positions % size
        mapping = vllm_slot_mapping(state, [(request, 0, lengths[i])], device=device)
        sglang_slots = rows[i, : lengths[i]].long()
        for k, v in (via_flashinfer, executor.gather_kv(state, request, 0),
                     (k_buf[vllm_slots], v_buf[vllm_slots]), (k_buf[mapping], v_buf[mapping]),
                     (k_buf[sglang_slots], v_buf[sglang_slots])):
            torch.testing.assert_close(_dense_attention(queries[request], k, v), want,
                                       atol=1e-3, rtol=1e-3)


@pytest.mark.cuda
def test_flashinfer_decode_matches_reference_on_cuda():
    flashinfer = pytest.importorskip("flashinfer")
    engine, executor = make(num_pages=24, page_size=4, device="cuda")
    engine.apply(ReqAlloc((1, 2)))
    decide(engine, plan_extend, [(1, 9), (2, 14)], at_head=True)
    state = engine.state
    for request in (1, 2):
        n = state.requests[request].allocated
        executor.set_kv_buffer(0, state.slots_of(request), torch.randn(n, 2, 8, device="cuda"),
                               torch.randn(n, 2, 8, device="cuda"))
    indptr, indices, last = flashinfer_page_table(state, [1, 2], device="cuda")
    workspace = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    wrapper.plan(indptr, indices, last, 4, 2, 8, 4, data_type=torch.float16)
    q = torch.randn(2, 4, 8, device="cuda").half()
    k_buf, v_buf = executor.get_kv_buffer(0)
    out = wrapper.run(q, (k_buf.view(-1, 4, 2, 8), v_buf.view(-1, 4, 2, 8)))
    for i, request in enumerate((1, 2)):
        want = _dense_attention(q[i], *executor.gather_kv(state, request, 0))
        torch.testing.assert_close(out[i].float(), want, atol=2e-3, rtol=2e-3)


# -- integrity --------------------------------------------------------------------------
def test_tags_are_exact_small_integers_and_distinct():
    tags = tag_values(torch.tensor([1, 1, 2]), torch.tensor([0, 1, 0]), 0, 32, 0)
    assert tags.min() >= -128 and tags.max() <= 127
    assert torch.equal(tags.half().long(), tags)
    assert not torch.equal(tags[0], tags[1]) and not torch.equal(tags[0], tags[2])
    assert not torch.equal(tags[0], tag_values(torch.tensor([1]), torch.tensor([0]), 1, 32, 0)[0])


def _prefix_sharing_flow(engine):
    """Request 1 caches a prompt; request 2 hits its prefix, then request 1 finishes."""
    engine.apply(ReqAlloc((1,)))
    decide(engine, plan_extend, [(1, 6)], at_head=True)
    tokens = [5, 6, 7, 8, 9, 10]
    cursor = decide(engine, plan_checkpoint, RequestCursor(1), tokens, prompt_len=6, up_to=6,
                    at_head=True)
    engine.apply(ReqAlloc((2,)))
    match = decide(engine, plan_match, [5, 6, 7, 8, 1, 1, 1])
    engine.apply(Assign(2, 0, match.slots))
    decide(engine, plan_extend, [(2, 7)], at_head=True)
    decide(engine, plan_release, cursor, tokens, prompt_len=6, owned=6, checkpoint=True,
           at_head=True)
    return match


@pytest.mark.parametrize("device", DEVICES)
def test_integrity_holds_through_prefix_sharing_and_release(device):
    engine, executor = make(device=device)
    monitor = enable_integrity(executor)
    match = _prefix_sharing_flow(engine)
    assert match.length == 4
    report = monitor.verify()
    assert report.ok, str(report)
    # request 2 (7 tokens) through 5 exports x 2 layers, plus the tree tokens
    tree_tokens = sum(len(n.key) for n in engine.state.nodes.values())
    assert report.tokens_checked == 2 * (7 * 5 + tree_tokens)


@pytest.mark.parametrize("incremental", [False, True])
def test_integrity_catches_aliasing_from_a_buggy_core(incremental):
    engine, executor = make()
    monitor = enable_integrity(executor)
    engine.apply(ReqAlloc((1, 2)))
    decide(engine, plan_extend, [(1, 2)], at_head=True)
    assert monitor.check().ok
    page = engine.state.requests[1].pages[0]
    # A core that hands request 1's page to request 2 as well: request 2 writes over it.
    smuggle(executor, Allocate((page,), ((2, (page * 2, page * 2 + 1)),)))
    report = monitor.check() if incremental else monitor.verify()
    assert not report.ok
    assert "request 1 position 0 reads another token's tag" in str(report)


def test_integrity_catches_a_missed_copy_on_write():
    engine, executor = make()
    monitor = enable_integrity(executor)
    engine.apply(ReqAlloc((1, 2)))
    decide(engine, plan_extend, [(1, 3)], at_head=True)
    engine.apply(Share(2, 0, tuple(engine.state.slots_of(1))))  # shares the partial page too
    # The core refuses an append into a shared page (spec finding F3) ...
    shared_slot = engine.state.slots_of(1)[2]
    with pytest.raises(InvalidEvent, match="alone"):
        engine.apply(Allocate((), ((2, (shared_slot + 1,)),)))
    # ... and if the bytes are written there anyway (a kernel ignoring the metadata),
    # the full verification sees another holder's token change under it.  (No event
    # moved those bytes, so an incremental check has nothing to look at.)
    for layer in range(CONFIG.num_layers):
        k, v = executor.get_kv_buffer(layer)
        executor.set_kv_buffer(layer, torch.tensor([shared_slot]), torch.ones_like(k[:1]),
                               torch.ones_like(v[:1]))
    assert monitor.check().ok
    report = monitor.verify()
    assert not report.ok and "position 2" in str(report)


def test_integrity_holds_with_copy_on_write():
    engine, executor = make()
    monitor = enable_integrity(executor)
    engine.apply(ReqAlloc((1, 2)))
    decide(engine, plan_extend, [(1, 3)], at_head=True)
    full, partial = engine.state.requests[1].pages
    engine.apply(Share(2, 0, (full * 2, full * 2 + 1)))
    fresh = engine.state.free_pages.head(1)[0]
    engine.apply(Allocate((fresh,)))
    engine.apply(Copy((partial,), (fresh,)))
    engine.apply(Assign(2, 2, (fresh * 2,)))
    check = monitor.check()
    assert check.ok and check.tokens_checked > 0, str(check)  # the copied page was read back
    decide(engine, plan_decode, [2, 1], at_head=True)
    report = monitor.verify()
    assert report.ok, str(report)
    assert monitor.req_content[2][2] == monitor.req_content[1][2]  # copied, not rewritten


@pytest.mark.parametrize("incremental", [False, True])
def test_integrity_catches_a_stale_prefix_hit(incremental):
    engine, executor = make(num_pages=4)
    monitor = enable_integrity(executor)
    engine.apply(ReqAlloc((1,)))
    decide(engine, plan_extend, [(1, 4)], at_head=True)
    cursor = decide(engine, plan_checkpoint, RequestCursor(1), [1, 2, 3, 4], prompt_len=4,
                    up_to=4, at_head=True)
    decide(engine, plan_release, cursor, [1, 2, 3, 4], prompt_len=4, owned=4, checkpoint=False,
           at_head=True)
    tree_page = engine.state.nodes[1].pages[0]
    engine.apply(ReqAlloc((2,)))
    assert monitor.check().ok
    # A buggy allocator hands the tree's page to request 2 while the node survives.
    smuggle(executor, Allocate((tree_page,), ((2, (tree_page * 2, tree_page * 2 + 1)),)))
    report = monitor.check() if incremental else monitor.verify()
    assert "a tree token does not read back its tag" in str(report)


def test_integrity_reports_linking_to_another_position():
    engine, executor = make()
    monitor = enable_integrity(executor)
    engine.apply(ReqAlloc((1, 2)))
    decide(engine, plan_extend, [(1, 4)], at_head=True)
    slots = engine.state.slots_of(1)
    engine.apply(Share(2, 0, tuple(slots[2:4])))  # page 2 of request 1 at position 0 of request 2
    report = monitor.verify()
    assert not report.ok and "computed for position 2" in str(report)


def test_integrity_checks_the_sglang_pool_table():
    from kvstate.sglang import PagedTokenToKVPoolAllocator, ReqToTokenPool

    pool = ReqToTokenPool(size=4, max_context_len=32)
    executor = TorchExecutor(CONFIG, 8, 2, device="cpu")
    allocator = PagedTokenToKVPoolAllocator(size=16, page_size=2, kvcache=executor)
    monitor = enable_integrity(executor, request_pool=pool)
    row = pool.alloc(1)[0]
    slots = allocator.alloc_extend([0], [5], [-1], 5)
    pool.write((row, slice(0, 5)), slots)
    report = monitor.verify()
    assert report.ok, str(report)
    assert report.tokens_checked == 2 * 5 * 6  # 6 exports including the pool's own table


def test_integrity_seeds_from_a_non_empty_state():
    engine, _ = make()
    _prefix_sharing_flow(engine)
    later = Engine(state=engine.state)  # an engine that already has state when attached
    executor = TorchExecutor(CONFIG, 16, 2, device="cpu")
    executor.attach(later)
    monitor = enable_integrity(executor)
    assert monitor.verify().ok
    state = later.state
    assert monitor.req_content[2][:4] == monitor.node_content[state.page_node[
        state.requests[2].pages[0]]][:4]
    decide(later, plan_decode, [2], at_head=True)  # and it follows from there
    assert monitor.check().ok and monitor.verify().ok


# -- replay and host pool ----------------------------------------------------------------
def test_replay_hook_rebuilds_and_verifies():
    engine, _ = make()
    _prefix_sharing_flow(engine)
    decide(engine, plan_evict, 100, at_head=True)
    engine.apply(ReqFree((2,)))
    result = replay_hook(engine, "cpu")
    assert result.ok, result.message
    assert result.events_applied == len(engine.events)
    assert "in 1 checks (full)" in result.message
    pair = replay_hook((engine.initial_state, list(engine.events)), "cpu", check_every=1)
    assert pair.ok and pair.tokens_checked > result.tokens_checked, pair.message
    assert f"in {len(engine.events) + 1} checks (incremental + 1 full)" in pair.message
    full = replay_hook((engine.initial_state, list(engine.events)), "cpu", check_every=1,
                       full_checks=True)
    assert full.ok and full.tokens_checked > pair.tokens_checked, full.message


def test_replay_hook_reports_a_bad_log():
    engine, _ = make()
    result = replay_hook(engine.initial_state, events=[Free((3,))])
    assert not result.ok and "double free" in result.message and result.events_applied == 0


def test_replay_hook_cuda_without_gpu_is_a_clean_failure():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    engine, _ = make()
    result = replay_hook(engine, "cuda")
    assert not result.ok and "no CUDA device" in result.message


def test_gather_kv_into_a_workspace():
    engine, executor = _three_requests()
    state = engine.state
    k_out, v_out = torch.full((12, 2, 8), 7.0).half(), torch.full((12, 2, 8), 7.0).half()
    k, v = executor.gather_kv(state, 1, 1, out=(k_out, v_out))
    assert k.data_ptr() == k_out.data_ptr() and k.shape == (5, 2, 8)
    assert torch.equal(k, executor.gather_kv(state, 1, 1)[0])
    with pytest.raises(ValueError, match="out must be"):
        executor.gather_kv(state, 1, 1, out=(k_out[:4], v_out[:4]))


def test_raw_words_views_share_memory():
    from kvstate.executor.buffers import raw_words

    tensor = torch.zeros(2, 3, 4, dtype=torch.float16)
    words = raw_words(tensor)
    assert words.dtype == torch.int64 and words.shape == (2, 3, 1)
    words[1, 2, 0] = -1
    assert torch.isnan(tensor[1, 2]).all()
    assert raw_words(torch.zeros(2, 3, 3, dtype=torch.float16)).dtype == torch.int16


def test_mla_executor_integrity_through_prefix_sharing():
    config = MLAConfig(num_layers=2, kv_lora_rank=8, qk_rope_head_dim=4)
    engine = Engine(Geometry(num_pages=16, page_size=2, num_rows=6, row_width=64))
    executor = MLATorchExecutor(config, 16, 2, device="cpu")
    executor.attach(engine)
    monitor = enable_integrity(executor)
    _prefix_sharing_flow(engine)
    report = monitor.verify()
    assert report.ok, str(report)
    decide(engine, plan_evict, 100, at_head=True)
    assert monitor.check().ok
    k, v = executor.gather_kv(engine.state, 2, 0)
    assert k.shape == (7, 12) and v.shape == (7, 8) and torch.equal(v, k[:, :8])
