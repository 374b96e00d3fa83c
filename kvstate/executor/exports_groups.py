"""vLLM block tables per KV-cache group, for the hybrid coordinator (``kvstate.vllm.hybrid``).

vLLM 0.33's ``HybridKVCacheCoordinator`` keeps one table per group for each
request (full attention, sliding window, Mamba "align"), all drawn from one
block pool; its model runner holds one block table per group and each
group's layers read theirs.  On the core, group ``g`` of request ``r`` is the
core request ``"r/g{g}"`` (:func:`group_request`), whose table is that
group's block ids, the null block 0 included where vLLM puts it (blocks a
sliding window or Mamba group no longer reads, Mamba's padding).

``vllm_group_block_tables(state, request_ids, num_groups)`` returns one
``[n, width]`` int32 table per group (rows padded with block 0, vLLM's
``BlockTable`` layout), ``vllm_group_slot_mappings`` the slot of each listed
token per group.  Pure reads of the state (``KeyError`` for a request
without that group).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from kvstate.executor.exports import padded_rows, request_pages, vllm_slot_mapping
from kvstate.state import RequestId


def group_request(request_id: RequestId, group: int) -> str:
    """The core request that holds group ``group``'s table of vLLM request ``request_id``."""
    return f"{request_id}/g{group}"


def _count(num_groups: int) -> int:
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups <= 0:
        raise ValueError(f"num_groups must be a positive int, got {num_groups!r}")
    return num_groups


def vllm_group_block_tables(state: object, request_ids: Sequence[RequestId], num_groups: int,
                            max_blocks: int | Sequence[int] | None = None,
                            device: str | torch.device = "cpu") -> list[torch.Tensor]:
    """One vLLM ``block_table`` per group: row ``i`` of table ``g`` is group ``g``'s block ids
    of ``request_ids[i]`` (0 where the group holds the null block, and as padding).

    ``max_blocks`` is each table's width (one int for all, or one per group; by default
    the longest row); ``KeyError`` for a request without that group, ``ValueError`` for
    a row wider than its table.
    """
    groups = _count(num_groups)
    widths: Sequence[int | None]
    if max_blocks is None or isinstance(max_blocks, int):
        widths = [max_blocks] * groups
    else:
        widths = list(max_blocks)
        if len(widths) != groups:
            raise ValueError(f"{len(widths)} widths for {groups} groups")
    tables = []
    for group in range(groups):
        rows = [request_pages(state, group_request(r, group)) for r in request_ids]
        tables.append(padded_rows(rows, widths[group], torch.int32,
                                  _too_long(request_ids, group)).to(device))
    return tables


def vllm_group_slot_mappings(state: object, spans: Sequence[tuple[RequestId, int, int]],
                             num_groups: int, device: str | torch.device = "cpu"
                             ) -> list[torch.Tensor]:
    """One vLLM ``slot_mapping`` per group for token spans ``(request, start, stop)`` (this
    step's tokens): the slot each token is written at in that group's layers (a null block's
    positions map into block 0, the padding sink, as vLLM's do)."""
    return [vllm_slot_mapping(state, [(group_request(r, g), start, stop)
                                      for r, start, stop in spans], device)
            for g in range(_count(num_groups))]


def _too_long(request_ids: Sequence[RequestId], group: int) -> Callable[[int, int, int], str]:
    def message(index: int, length: int, width: int) -> str:
        return (f"request {request_ids[index]!r} has {length} blocks in group {group}, "
                f"more than {width}")
    return message


__all__ = ["group_request", "vllm_group_block_tables", "vllm_group_slot_mappings"]

