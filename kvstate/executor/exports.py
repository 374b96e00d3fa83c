"""Reads in the layouts real attention kernels consume, all computed from a ``State``.

A request is its core request id: the SGLang front end's row number
(``req_pool_idx``) or a seed-002 / vLLM request name.  Index exports are pure
functions of the state that return fresh int32 tensors; ``gather_kv`` reads
an executor's buffers and returns fresh contiguous tensors.  Nothing here
mutates a state or a buffer.

Formats (P = page size, ``len`` = a request's mapped tokens)::

    flashinfer_page_table  kv_indptr [n+1], kv_indices [sum pages], kv_last_page_len [n]
                           (paged KV is ``k_buffer[layer].view(-1, P, H, D)``: page id = row)
    vllm_block_table       [n, max_blocks] page ids, padded with page 0 (the padding sink)
    vllm_slot_mapping      slot of every listed token, ``block * P + pos % P``
    sglang_req_to_token    [n, width] slots per position, padded with slot 0
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvstate.executor.copies import raw_words
from kvstate.state import RequestId, State


def _length(state: State, request: RequestId) -> int:
    record = state.requests.get(request)
    if record is None:
        raise KeyError(f"unknown request {request!r}")
    return record.allocated


def request_pages(state: State, request: RequestId) -> list[int]:
    """Pages backing a request's mapped tokens, in order."""
    length = _length(state, request)
    size = state.geometry.page_size
    return list(state.requests[request].pages[: -(-length // size)])


def request_slots(state: State, request: RequestId) -> list[int]:
    return state.slots_of(request)


def gather_kv(executor: Any, state: State, request: RequestId, layer: int,
              out: tuple[torch.Tensor, torch.Tensor] | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k, v)`` of a request's mapped tokens in one layer, contiguous in token order.

    Copies whole pages (as integer words) and trims the last one, so the
    read is page-granular like a paged kernel's.  ``out`` may give two
    preallocated tensors of at least ``pages * P`` rows to fill (a workspace);
    the results are then prefixes of them.  For an MLA executor ``k`` is the
    latent row and ``v`` its first ``kv_lora_rank`` columns.
    """
    length = _length(state, request)
    pages = torch.tensor(request_pages(state, request), dtype=torch.int64, device=executor.device)
    size = state.geometry.page_size
    k_buffer, v_buffer = executor.get_kv_buffer(layer)
    k_out, v_out = (None, None) if out is None else out
    return (_gather_pages(k_buffer, pages, size, length, k_out),
            _gather_pages(v_buffer, pages, size, length, v_out))


def _gather_pages(buffer: torch.Tensor, pages: torch.Tensor, size: int, length: int,
                  out: torch.Tensor | None) -> torch.Tensor:
    if not buffer.is_contiguous():  # a column view (MLA value): gather rows
        rows = (pages[:, None] * size + torch.arange(size, device=pages.device)).reshape(-1)
        selected = buffer.index_select(0, rows[:length])
        return selected if out is None else out[:length].copy_(selected)
    row_shape = buffer.shape[1:]
    words = raw_words(buffer.view(-1, size, *row_shape), leading=1)
    if out is None:
        out = torch.empty((len(pages) * size, *row_shape), dtype=buffer.dtype, device=buffer.device)
    elif out.shape[1:] != row_shape or out.shape[0] < len(pages) * size or not out.is_contiguous():
        raise ValueError(f"out must be contiguous [>= {len(pages) * size}, {list(row_shape)}]")
    target = raw_words(out[: len(pages) * size].view(-1, size, *row_shape), leading=1)
    torch.index_select(words, 0, pages, out=target)
    return out[:length]


def flashinfer_page_table(state: State, requests: Sequence[RequestId],
                          device: str | torch.device = "cpu"
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's paged-KV description ``(kv_indptr, kv_indices, kv_last_page_len)``.

    A request with no mapped token has no page and ``kv_last_page_len`` 0.
    """
    size = state.geometry.page_size
    indptr = [0]
    indices: list[int] = []
    last: list[int] = []
    for request in requests:
        length = _length(state, request)
        pages = request_pages(state, request)
        indices.extend(pages)
        indptr.append(len(indices))
        last.append(0 if length == 0 else length - (len(pages) - 1) * size)
    return (torch.tensor(indptr, dtype=torch.int32, device=device),
            torch.tensor(indices, dtype=torch.int32, device=device),
            torch.tensor(last, dtype=torch.int32, device=device))


def vllm_block_table(state: State, requests: Sequence[RequestId], max_blocks: int | None = None,
                     device: str | torch.device = "cpu") -> torch.Tensor:
    """vLLM's ``block_table``: one row of page ids per request, padded with page 0."""
    rows = [request_pages(state, r) for r in requests]
    width = max((len(r) for r in rows), default=0) if max_blocks is None else max_blocks
    table = torch.zeros((len(rows), width), dtype=torch.int32)
    for index, pages in enumerate(rows):
        if len(pages) > width:
            raise ValueError(f"request {requests[index]!r} has {len(pages)} blocks, more than {width}")
        table[index, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
    return table.to(device)


def vllm_slot_mapping(state: State, spans: Sequence[tuple[RequestId, int, int]],
                      device: str | torch.device = "cpu") -> torch.Tensor:
    """vLLM's ``slot_mapping`` for token spans ``(request, start, stop)`` (e.g. this step's tokens)."""
    slots: list[int] = []
    for request, start, stop in spans:
        length = _length(state, request)
        if not 0 <= start <= stop <= length:
            raise ValueError(f"span {start}:{stop} outside the {length} mapped tokens of {request!r}")
        slots.extend(state.slots_of(request, start, stop))
    return torch.tensor(slots, dtype=torch.int64, device=device)


def sglang_req_to_token(state: State, requests: Sequence[RequestId], width: int | None = None,
                        device: str | torch.device = "cpu") -> torch.Tensor:
    """SGLang's ``req_to_token`` rows for ``requests`` (positions past a request's end are 0)."""
    lengths = [_length(state, r) for r in requests]
    columns = max(lengths, default=0) if width is None else width
    table = torch.zeros((len(requests), columns), dtype=torch.int32)
    for index, request in enumerate(requests):
        if lengths[index] > columns:
            raise ValueError(f"request {request!r} maps {lengths[index]} tokens, more than {columns}")
        if lengths[index]:
            table[index, : lengths[index]] = torch.tensor(state.slots_of(request), dtype=torch.int32)
    return table.to(device)


def slots_from_page_table(kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                          kv_last_page_len: torch.Tensor, page_size: int) -> list[torch.Tensor]:
    """Per-request slot tensors a FlashInfer kernel would read (inverse of the table)."""
    out = []
    offsets = torch.arange(page_size, dtype=torch.int64, device=kv_indices.device)
    for index in range(len(kv_last_page_len)):
        pages = kv_indices[int(kv_indptr[index]): int(kv_indptr[index + 1])].to(torch.int64)
        slots = (pages[:, None] * page_size + offsets).reshape(-1)
        length = 0 if len(pages) == 0 else (len(pages) - 1) * page_size + int(kv_last_page_len[index])
        out.append(slots[:length])
    return out


def slots_from_block_table(block_table: torch.Tensor, lengths: Sequence[int],
                           page_size: int) -> list[torch.Tensor]:
    """Per-request slot tensors read through a vLLM block table."""
    out = []
    for index, length in enumerate(lengths):
        positions = torch.arange(length, dtype=torch.int64, device=block_table.device)
        blocks = block_table[index].to(torch.int64)[positions // page_size]
        out.append(blocks * page_size + positions % page_size)
    return out
