"""Reading tokens back through every export (for the integrity check).

Read-only: builds index tensors from a ``State`` with the export functions
and gathers rows from an executor's buffers; nothing is written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kvstate.executor import exports
from kvstate.state import RequestId, State

Reads = Callable[[int], dict[str, tuple[torch.Tensor, torch.Tensor]]]


def export_reads(ex: Any, state: State, requests: list[RequestId], lengths: list[int],
                 request_pool: Any = None) -> Reads:
    """A function ``layer -> {export name: (k rows, v rows)}`` reading every listed token."""
    size = state.geometry.page_size
    device = ex.device
    table = exports.flashinfer_page_table(state, requests, device=device)
    flashinfer_slots = exports.slots_from_page_table(*table, page_size=size)
    block_table = exports.vllm_block_table(state, requests, device=device)
    block_slots = exports.slots_from_block_table(block_table, lengths, size)
    mapping = exports.vllm_slot_mapping(state, [(r, 0, n) for r, n in zip(requests, lengths,
                                                                          strict=True)], device=device)
    req_rows = exports.sglang_req_to_token(state, requests, device=device)
    rows_slots = [req_rows[i, :n].to(torch.int64) for i, n in enumerate(lengths)]
    pool_slots: list[torch.Tensor] | None = None
    if request_pool is not None and all(isinstance(r, int) for r in requests):
        pool_table = request_pool.req_to_token
        pool_slots = [pool_table[int(r), :n].to(device=device, dtype=torch.int64)
                      for r, n in zip(requests, lengths, strict=True)]

    def reads(layer: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        k_buf, v_buf = ex.get_kv_buffer(layer)
        gathered = [ex.gather_kv(state, r, layer) for r, n in zip(requests, lengths, strict=True)]
        out = {
            "gather_kv": (torch.cat([g[0][:n] for g, n in zip(gathered, lengths, strict=True)]),
                          torch.cat([g[1][:n] for g, n in zip(gathered, lengths, strict=True)])),
        }
        named = {"flashinfer_page_table": flashinfer_slots, "vllm_block_table": block_slots,
                 "sglang_req_to_token": rows_slots}
        if pool_slots is not None:
            named["ReqToTokenPool.req_to_token"] = pool_slots
        for name, per_request in named.items():
            index = torch.cat(per_request) if per_request else mapping[:0]
            out[name] = (k_buf.index_select(0, index), v_buf.index_select(0, index))
        out["vllm_slot_mapping"] = (k_buf.index_select(0, mapping), v_buf.index_select(0, mapping))
        return out

    return reads


def compare_reads(name: str, layer: int, k_got: torch.Tensor, k_want: torch.Tensor, v_got: torch.Tensor,
             v_want: torch.Tensor, requests: list[RequestId], lengths: list[int]) -> list[str]:
    if k_got.shape == k_want.shape and torch.equal(k_got, k_want) and torch.equal(v_got, v_want):
        return []
    if k_got.shape != k_want.shape:
        return [f"{name} layer {layer}: read {tuple(k_got.shape)}, expected {tuple(k_want.shape)}"]
    bad = ((k_got != k_want).flatten(1).any(1) | (v_got != v_want).flatten(1).any(1)).nonzero()
    first = int(bad[0])
    for request_id, length in zip(requests, lengths, strict=True):
        if first < length:
            return [f"{name} layer {layer}: request {request_id!r} position {first} reads another "
                    f"token's tag ({len(bad)} bad reads)"]
        first -= length
    return [f"{name} layer {layer}: {len(bad)} bad reads"]  # pragma: no cover - unreachable
