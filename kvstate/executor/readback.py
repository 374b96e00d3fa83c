"""Reading tokens back through every export (for the full integrity verification).

Read-only: builds index lists from a state (frozen or live) with the export
functions and reads rows of an executor's buffers through its
:class:`~kvstate.executor.integrity_tags.TagLayout`; nothing is written.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from kvstate.executor import exports
from kvstate.executor.integrity_tags import Content, TagLayout
from kvstate.state import RequestId


def export_slots(ex: Any, state: Any, requests: list[RequestId], lengths: list[int],
                 request_pool: Any = None) -> dict[str, np.ndarray]:
    """Per export, the slots it maps every listed token to (requests in order, concatenated).

    ``requests`` must have no dangling entry (the whole-row exports refuse those).
    """
    size = state.geometry.page_size
    device = ex.device
    table = exports.flashinfer_page_table(state, requests, device=device)
    block_table = exports.vllm_block_table(state, requests, device=device)
    mapping = exports.vllm_slot_mapping(state, [(r, 0, n) for r, n in zip(requests, lengths,
                                                                          strict=True)], device=device)
    req_rows = exports.sglang_req_to_token(state, requests, device=device)
    named = {
        "flashinfer_page_table": exports.slots_from_page_table(*table, page_size=size),
        "vllm_block_table": exports.slots_from_block_table(block_table, lengths, size),
        "sglang_req_to_token": [req_rows[i, :n].to(torch.int64) for i, n in enumerate(lengths)],
    }
    if request_pool is not None and all(isinstance(r, int) for r in requests):
        pool_table = request_pool.req_to_token
        named["ReqToTokenPool.req_to_token"] = [pool_table[int(r), :n].to(torch.int64)
                                                for r, n in zip(requests, lengths, strict=True)]
    out = {name: torch.cat(parts).cpu().numpy() if parts else np.zeros(0, dtype=np.int64)
           for name, parts in named.items()}
    out["vllm_slot_mapping"] = mapping.cpu().numpy()
    return out


def gather_problems(ex: Any, layout: TagLayout, state: Any, requests: list[RequestId],
                    lengths: list[int], contents: list[Content]) -> list[str]:
    """``gather_kv`` of every request in every layer against the expected words."""
    problems: list[str] = []
    mla = not hasattr(ex, "v_head_dim")
    for layer in range(ex.layer_num):
        want_k = layout.expected_layer(contents, layer, 0)
        want_v = layout.expected_layer(contents, layer, 0 if mla else 1)
        offset = 0
        for request_id, length in zip(requests, lengths, strict=True):
            k, v = ex.gather_kv(state, request_id, layer)
            got_k, got_v = _words(k[:length], layout), _words(v[:length], layout)
            rows = slice(offset, offset + length)
            bad = ((got_k != want_k[rows]).any(axis=1)
                   | (got_v != want_v[rows, : got_v.shape[1]]).any(axis=1))
            if bad.any():
                problems.append(f"gather_kv layer {layer}: request {request_id!r} position "
                                f"{int(np.flatnonzero(bad)[0])} reads another token's tag "
                                f"({int(bad.sum())} bad reads)")
            offset += length
    return problems


def _words(tensor: torch.Tensor, layout: TagLayout) -> np.ndarray:
    words = layout.groups[0].words.dtype
    flat = tensor.contiguous().reshape(tensor.shape[0], math.prod(tensor.shape[1:]))
    return flat.view(words).cpu().numpy()


def locate(row: int, requests: list[RequestId], lengths: list[int]) -> tuple[RequestId, int]:
    """The request and position of row ``row`` of a concatenated read."""
    for request_id, length in zip(requests, lengths, strict=True):
        if row < length:
            return request_id, row
        row -= length
    raise IndexError(row)
