"""Page and row copies of the executor's data plane: layout, page path, row path, host pool."""

from __future__ import annotations

import pytest
import torch

from kvstate import ModelConfig
from kvstate.executor import HostPool, MLAConfig, MLATorchExecutor, TorchExecutor
from kvstate.executor.copies import PageViews, copy_rows, slot_runs, whole_pages
from kvstate.executor.index_plan import page_slots

SAME_DIMS = ModelConfig(num_layers=3, num_kv_heads=2, head_dim=8)
MIXED_DIMS = ModelConfig(num_layers=2, num_kv_heads=2, head_dim=8, v_head_dim=4)


def filled(config: ModelConfig, num_pages: int = 8, page_size: int = 4) -> TorchExecutor:
    executor = TorchExecutor(config, num_pages, page_size, device="cpu")
    generator = torch.Generator().manual_seed(0)
    for buffer in (*executor.k_buffer, *executor.v_buffer):
        buffer.copy_(torch.randn(buffer.shape, generator=generator).half())
    return executor


def snapshot(executor: TorchExecutor) -> list[torch.Tensor]:
    return [b.clone() for b in (*executor.k_buffer, *executor.v_buffer)]


def reference_copy(buffers: list[torch.Tensor], src_pages, dst_pages, size: int) -> None:
    """One page at a time, in list order: the semantics the executor must keep."""
    for src, dst in zip(src_pages, dst_pages, strict=True):
        for buffer in buffers:
            buffer[dst * size:(dst + 1) * size] = buffer[src * size:(src + 1) * size].clone()


def test_same_head_dims_share_one_allocation_and_keep_contiguous_per_layer_buffers():
    executor = TorchExecutor(SAME_DIMS, 5, 4, device="cpu")
    assert len(executor.page_views.tensors) == 1
    base = executor.page_views.tensors[0]
    assert base.shape == (6, 24, 2, 8)
    for layer in range(3):
        for buffer in (executor.k_buffer[layer], executor.v_buffer[layer]):
            assert buffer.shape == (24, 2, 8) and buffer.is_contiguous()
            assert buffer.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert executor.v_buffer[0].data_ptr() == base[3].data_ptr()  # K layers first, then V
    assert executor._k.is_contiguous() and executor._v.is_contiguous()
    assert executor.nbytes == SAME_DIMS.bytes_per_token * 24


def test_mixed_head_dims_keep_two_allocations():
    executor = TorchExecutor(MIXED_DIMS, 5, 4, device="cpu")
    assert [t.shape[-1] for t in executor.page_views.tensors] == [8, 4]


@pytest.mark.parametrize("config", [SAME_DIMS, MIXED_DIMS])
@pytest.mark.parametrize(("src", "dst"), [
    ([1, 2, 3], [6, 7, 8]),        # one run of adjacent pages
    ([5, 1, 7], [2, 8, 3]),        # scattered, disjoint
    ([1, 2, 3], [2, 3, 4]),        # overlapping chain: list order matters
    ([4, 2], [2, 4]),              # a swap written as two copies
])
def test_copy_pages_matches_page_by_page_reference(config, src, dst):
    executor = filled(config)
    want = snapshot(executor)
    reference_copy(want, src, dst, 4)
    executor.copy_pages(src, dst)
    assert all(torch.equal(a, b) for a, b in zip(snapshot(executor), want, strict=True))


@pytest.mark.parametrize("config", [SAME_DIMS, MIXED_DIMS])
def test_copy_slots_takes_the_page_path_for_whole_pages_and_rows_otherwise(config):
    executor = filled(config)
    want = snapshot(executor)
    reference_copy(want, [3], [6], 4)
    executor.copy_slots(list(range(12, 16)), list(range(24, 28)))
    assert all(torch.equal(a, b) for a, b in zip(snapshot(executor), want, strict=True))
    rows_src, rows_dst = [5, 6, 13], [30, 31, 9]  # partial pages
    for buffer in want:
        buffer[rows_dst] = buffer[rows_src].clone()
    executor.copy_slots(rows_src, rows_dst)
    assert all(torch.equal(a, b) for a, b in zip(snapshot(executor), want, strict=True))


def test_whole_pages_recognises_only_aligned_complete_pages():
    assert whole_pages([8, 9, 10, 11, 4, 5, 6, 7], 4) == [2, 1]
    assert whole_pages([9, 10, 11, 12], 4) is None      # not aligned
    assert whole_pages([8, 9, 11, 10], 4) is None       # not in order
    assert whole_pages([8, 9, 10], 4) is None           # not a whole page
    assert whole_pages([], 4) is None


def test_plan_slot_tuples_remember_their_pages():
    slots = page_slots([3, 1], 2)
    assert slots == (6, 7, 2, 3) and isinstance(slots, tuple)
    assert whole_pages(slots, 2) == [3, 1]  # read from the tuple, no scan
    assert whole_pages(slots, 1) == [6, 7, 2, 3]  # another page size: scanned
    assert whole_pages(page_slots([], 2), 2) is None


def test_slot_runs_merge_adjacent_pairs_but_never_read_what_they_write():
    assert slot_runs([5, 6, 1], [9, 10, 3]) == [(5, 9, 2), (1, 3, 1)]
    assert slot_runs([1, 2], [2, 3]) == [(1, 2, 1), (2, 3, 1)]
    assert slot_runs([1, 2, 3], [3, 4, 5]) == [(1, 3, 2), (3, 5, 1)]


def test_bad_page_copies_raise_and_change_nothing():
    executor = filled(SAME_DIMS)
    before = snapshot(executor)
    with pytest.raises(IndexError, match="page outside"):
        executor.copy_pages([1, 9], [2, 3])
    with pytest.raises(IndexError, match="page outside"):
        executor.copy_pages([1], [-1])
    with pytest.raises(ValueError, match="source pages"):
        executor.copy_pages([1, 2], [3])
    with pytest.raises(ValueError, match="source slots"):
        executor.copy_slots([4, 5], [8])
    assert all(torch.equal(a, b) for a, b in zip(snapshot(executor), before, strict=True))


def test_page_views_reject_tensors_of_different_row_counts():
    with pytest.raises(ValueError, match="row count"):
        PageViews([torch.zeros(2, 8, 3), torch.zeros(2, 12, 3)], 4)
    with pytest.raises(ValueError, match="at least one"):
        PageViews([], 4)


def test_overlapping_row_chain_in_a_single_layer_copies_in_order():
    buffer = torch.arange(10, dtype=torch.float16).view(1, 10, 1)
    copy_rows(buffer, buffer, [1, 2, 3], [2, 3, 4])  # one contiguous layer: no overlapping view copy
    assert buffer.flatten().tolist() == [0, 1, 1, 1, 1, 5, 6, 7, 8, 9]


def test_row_copies_with_many_runs_fall_back_to_gather_and_scatter():
    src_buffer = torch.arange(2 * 40 * 3, dtype=torch.float16).view(2, 40, 3)
    dst_buffer = torch.zeros_like(src_buffer)
    src_rows, dst_rows = list(range(0, 40, 2)), list(range(39, 0, -2))
    copy_rows(dst_buffer, src_buffer, src_rows, dst_rows, max_runs=4)
    assert torch.equal(dst_buffer[:, dst_rows], src_buffer[:, src_rows])
    assert torch.count_nonzero(dst_buffer[:, 0::2]) == 0


@pytest.mark.parametrize("config", [SAME_DIMS, MIXED_DIMS])
def test_host_pool_mirrors_the_device_layout_and_round_trips_pages(config):
    executor = filled(config)
    host = HostPool(executor, num_pages=4)
    assert host.nbytes == config.bytes_per_page(4) * 4
    assert host.pinned == torch.cuda.is_available()  # page-locked host memory when there is a GPU
    assert len(host.page_views.tensors) == len(executor.page_views.tensors)
    host.offload([5, 2, 3], [3, 0, 1])
    for layer in range(config.num_layers):
        k_rows, v_rows = host.read(layer, list(range(12, 16)))
        assert torch.equal(k_rows, executor.k_buffer[layer][20:24])
        assert torch.equal(v_rows, executor.v_buffer[layer][20:24])
    want = snapshot(executor)
    reference_copy(want, [5, 2, 3], [7, 8, 1], 4)
    host.load([3, 0, 1], [7, 8, 1])
    assert all(torch.equal(a, b) for a, b in zip(snapshot(executor), want, strict=True))
    with pytest.raises(IndexError, match="outside 0..3"):
        host.offload([1], [4])


def test_host_pool_slot_forms_handle_partial_pages():
    executor = filled(SAME_DIMS)
    host = HostPool(executor, num_pages=2)
    host.offload_slots([9, 10], [1, 6])
    k_rows, v_rows = host.read(2, [1, 6])
    assert torch.equal(k_rows, executor.k_buffer[2][[9, 10]])
    assert torch.equal(v_rows, executor.v_buffer[2][[9, 10]])
    host.load_slots([1, 6], [30, 31])
    assert torch.equal(executor.v_buffer[1][[30, 31]], executor.v_buffer[1][[9, 10]])
    with pytest.raises(ValueError, match="source slots"):
        host.load_slots([1], [2, 3])


def test_mla_copy_pages_and_host_pool():
    config = MLAConfig(num_layers=2, kv_lora_rank=8, qk_rope_head_dim=4)
    executor = MLATorchExecutor(config, num_pages=6, page_size=2, device="cpu")
    executor._kv.copy_(torch.randn(executor._kv.shape).half())
    want = executor._kv.clone()
    want[:, 10:12] = want[:, 2:4].clone()
    executor.copy_pages([1], [5])
    assert torch.equal(executor._kv, want)
    host = HostPool(executor, num_pages=2)
    host.offload([5], [1])
    (rows,) = host.read(1, [2, 3])
    assert torch.equal(rows, executor.kv_buffer[1][10:12])
