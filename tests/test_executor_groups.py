"""vLLM's per-group block tables for the hybrid coordinator (``vllm_group_block_tables``).

Driven by kvstate's vLLM ``HybridKVCacheManager`` (full attention plus sliding-window and / or
Mamba groups, one block pool) as vLLM's scheduler calls it; a ``TorchExecutor`` follows its
engine in integrity mode, and each group's table is read back through the executor's bytes.
"""

from __future__ import annotations

import pytest
import torch
from vllm_helpers import BS, FULL, MAMBA, SWA, hybrid_config

from kvstate import ModelConfig
from kvstate.executor import (
    TorchExecutor,
    enable_integrity,
    vllm_block_table,
    vllm_group_block_tables,
    vllm_group_slot_mappings,
)
from kvstate.executor.exports import slots_from_block_table
from kvstate.executor.exports_groups import group_request
from kvstate.vllm import KVCacheManager, Request
from kvstate.vllm.hybrid import HybridKVCacheManager

LAYOUTS = {"swa": [SWA, SWA], "mamba": [MAMBA], "both": [SWA, MAMBA]}


def manager_for(kind: str, blocks: int = 48) -> HybridKVCacheManager:
    manager = KVCacheManager(hybrid_config(FULL, *LAYOUTS[kind], num_blocks=blocks), 256, BS, BS,
                             max_in_flight_tokens=256)
    assert isinstance(manager, HybridKVCacheManager)
    return manager


def run(manager: HybridKVCacheManager, prompts: dict[str, list[int]], decodes: int
        ) -> dict[str, Request]:
    """Admit each prompt (chunked as the scheduler splits it), then decode them together."""
    requests = {}
    for rid, prompt in prompts.items():
        manager.new_step_starts()
        request = Request(rid, prompt, BS)
        blocks, hit, junction = manager.get_computed_blocks(request)
        request.shared_prefix_boundary = junction
        count = manager.mamba_block_aligned_split(request, request.num_tokens - hit, hit)
        assert manager.allocate_slots(request, count, hit, blocks,
                                      full_sequence_must_fit=True) is not None
        request.num_computed_tokens = hit + count
        while request.num_computed_tokens < request.num_tokens:
            manager.new_step_starts()
            count = manager.mamba_block_aligned_split(
                request, request.num_tokens - request.num_computed_tokens)
            assert manager.allocate_slots(request, count) is not None
            request.num_computed_tokens += count
        request.append_output_token_ids(900)
        requests[rid] = request
    for step in range(decodes):
        manager.new_step_starts()
        for request in requests.values():
            assert manager.allocate_slots(request, 1) is not None
            request.num_computed_tokens += 1
            request.append_output_token_ids(901 + step)
    return requests


PROMPTS = {"A": list(range(100, 120)), "B": list(range(100, 123)) + [7, 8]}


@pytest.mark.parametrize("kind", sorted(LAYOUTS))
def test_group_tables_are_the_managers_block_ids(kind):
    manager = manager_for(kind)
    run(manager, PROMPTS, decodes=5)
    view = manager.engine.view
    groups = manager.num_kv_cache_groups
    tables = vllm_group_block_tables(view, ["A", "B"], groups)
    assert len(tables) == groups
    nulls = 0
    for group, table in enumerate(tables):
        assert table.dtype == torch.int32
        for row, rid in enumerate(("A", "B")):
            ids = manager.get_block_ids(rid)[group]
            assert table[row, :len(ids)].tolist() == ids and not table[row, len(ids):].any()
            nulls += ids.count(0)
        assert torch.equal(table, vllm_block_table(view, [group_request("A", group),
                                                          group_request("B", group)],
                                                   max_blocks=table.shape[1]))
    assert nulls  # the window / Mamba groups hold the null block where vLLM does
    wide = vllm_group_block_tables(view, ["B"], groups, max_blocks=16)
    assert all(t.shape == (1, 16) for t in wide)
    with pytest.raises(ValueError, match="more than"):
        vllm_group_block_tables(view, ["B"], groups, max_blocks=1)
    with pytest.raises(ValueError, match="widths"):
        vllm_group_block_tables(view, ["B"], groups, max_blocks=[16])
    with pytest.raises(KeyError):
        vllm_group_block_tables(view, ["B"], groups + 1)
    with pytest.raises(ValueError, match="num_groups"):
        vllm_group_block_tables(view, ["B"], 0)


@pytest.mark.parametrize("kind", sorted(LAYOUTS))
def test_each_groups_table_reads_its_kv_through_the_executor(kind):
    manager = manager_for(kind)
    view = manager.engine.view
    executor = TorchExecutor(ModelConfig(2, 1, 8), view.geometry.num_pages, BS, device="cpu",
                             poison_freed=True)
    executor.attach(manager.engine)
    monitor = enable_integrity(executor)
    requests = run(manager, PROMPTS, decodes=6)
    manager.free(requests.pop("A"))
    run(manager, {"C": list(range(100, 121))}, decodes=2)  # a hit on A's cached blocks
    assert monitor.check().ok and monitor.verify().ok
    rids = ["B", "C"]
    groups = manager.num_kv_cache_groups
    for group, table in enumerate(vllm_group_block_tables(view, rids, groups)):
        holders = [group_request(rid, group) for rid in rids]
        lengths = [view.requests[h].allocated for h in holders]
        slots = torch.cat(slots_from_block_table(table, lengths, BS))
        contents = [c for h in holders for c in monitor.req_content[h]]
        assert len(contents) == len(slots)
        assert not len(monitor.layout.mismatches(slots.numpy(), contents)), (kind, group)
    spans = [(rid, view.requests[group_request(rid, 0)].allocated - 1,
              view.requests[group_request(rid, 0)].allocated) for rid in rids]
    mappings = vllm_group_slot_mappings(view, spans, groups)
    tables = vllm_group_block_tables(view, rids, groups)
    for group, mapping in enumerate(mappings):
        for row, (_rid, start, _) in enumerate(spans):
            block = int(tables[group][row, start // BS])
            assert int(mapping[row]) == block * BS + start % BS
