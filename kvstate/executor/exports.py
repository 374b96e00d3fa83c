"""Reads in the layouts real attention kernels consume, all computed from a state.

The state is a frozen ``State`` or an engine's ``LiveState`` (``engine.view``;
only the attribute names they share are read).  A request is its core
request id: the SGLang front end's row number (``req_pool_idx``) or a
seed-002 / vLLM request name.  Index exports are pure functions of the state
that return fresh int32 tensors; ``gather_kv`` reads an executor's buffers
and returns fresh contiguous tensors.  Nothing here mutates a state or a buffer.

Dangling entries: after ``FreeMapped`` a row may still map a page that went
back to the free list, until the row is rewritten there, truncated or
closed.  Any export asked to read such an entry raises :class:`UseAfterFree`
rather than hand a kernel a freed slot.

Formats (P = page size, ``len`` = a request's mapped tokens)::

    flashinfer_page_table  kv_indptr [n+1], kv_indices [sum pages], kv_last_page_len [n]
                           (paged KV is ``k_buffer[layer].view(-1, P, H, D)``: page id = row)
    vllm_block_table       [n, max_blocks] page ids, padded with page 0 (the padding sink)
    vllm_slot_mapping      slot of every listed token, ``block * P + pos % P``
    sglang_req_to_token    [n, width] slots per position, padded with slot 0

The sliding-window layers of a FULL + SWA hybrid read their own pool at
``full_to_swa[slot]`` (the SWA slot at the same offset of the FULL page's SWA
page, 0 where it has none), from the state's pairing or from a
``full_to_swa_index_mapping`` tensor given as ``mapping``::

    swa_slots              the SWA slot of each FULL slot (SGLang's ``translate_loc_from_full_to_swa``)
    sglang_swa_req_to_token  ``sglang_req_to_token`` translated: [n, width] SWA slots
    swa_window_indices     kv_indptr [n+1], kv_indices: the SWA slots of each request's last
                           ``window`` positions (a sliding-window layer's paged-KV indices)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from kvstate.executor.copies import raw_words
from kvstate.executor.read_errors import SwaKVLost, UseAfterFree
from kvstate.state import RequestId, slot_span


def _record(state: Any, request: RequestId, start: int = 0, stop: int | None = None) -> Any:
    """The request's table; ``UseAfterFree`` if positions ``[start, stop)`` reach a dangling entry."""
    record = state.requests.get(request)
    if record is None:
        raise KeyError(f"unknown request {request!r}")
    if record.dangling:
        size = state.geometry.page_size
        stop = record.allocated if stop is None else stop
        first, last = start // size, -(-stop // size)
        hit = [index for index in record.dangling if first <= index < last]
        if hit:
            index = hit[0]
            positions = range(max(start, index * size),
                              min(stop, index * size + size, record.allocated))
            raise UseAfterFree(request, positions, record.pages[index], hit)
    return record


def _length(state: Any, request: RequestId) -> int:
    return int(_record(state, request).allocated)


def request_pages(state: Any, request: RequestId) -> list[int]:
    """Pages backing a request's mapped tokens, in order (``UseAfterFree`` if one is dangling)."""
    record = _record(state, request)
    return list(record.pages[: -(-record.allocated // state.geometry.page_size)])


def request_slots(state: Any, request: RequestId, start: int = 0, stop: int | None = None
                  ) -> list[int]:
    """Slots of positions ``[start, stop)`` of a request (``UseAfterFree`` if one is dangling)."""
    record = _record(state, request, start, stop)
    end = record.allocated if stop is None else min(stop, record.allocated)
    return list(slot_span(record.pages, state.geometry.page_size, start, end))


def gather_kv(executor: Any, state: Any, request: RequestId, layer: int,
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


def flashinfer_page_table(state: Any, requests: Sequence[RequestId],
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


def vllm_block_table(state: Any, requests: Sequence[RequestId], max_blocks: int | None = None,
                     device: str | torch.device = "cpu") -> torch.Tensor:
    """vLLM's ``block_table``: one row of page ids per request, padded with page 0."""
    rows = [request_pages(state, r) for r in requests]
    return padded_rows(rows, max_blocks, torch.int32, lambda index, length, width: (
        f"request {requests[index]!r} has {length} blocks, more than {width}")).to(device)


def padded_rows(rows: Sequence[Sequence[int]], width: int | None, dtype: torch.dtype,
                too_long: Callable[[int, int, int], str]) -> torch.Tensor:
    """One tensor row per sequence, padded with 0 to ``width`` columns (None: the longest);
    a row longer than ``width`` is a ``ValueError`` saying ``too_long(index, length, width)``."""
    columns = max((len(row) for row in rows), default=0) if width is None else width
    table = torch.zeros((len(rows), columns), dtype=dtype)
    for index, row in enumerate(rows):
        if len(row) > columns:
            raise ValueError(too_long(index, len(row), columns))
        if row:
            table[index, : len(row)] = torch.tensor(row, dtype=dtype)
    return table


def vllm_slot_mapping(state: Any, spans: Sequence[tuple[RequestId, int, int]],
                      device: str | torch.device = "cpu") -> torch.Tensor:
    """vLLM's ``slot_mapping`` for token spans ``(request, start, stop)`` (e.g. this step's tokens).

    Only the spans are read: a dangling entry elsewhere in the row is no use after free.
    """
    slots: list[int] = []
    for request, start, stop in spans:
        record = state.requests.get(request)
        if record is None:
            raise KeyError(f"unknown request {request!r}")
        length = record.allocated
        if not 0 <= start <= stop <= length:
            raise ValueError(f"span {start}:{stop} outside the {length} mapped tokens of {request!r}")
        slots.extend(request_slots(state, request, start, stop))
    return torch.tensor(slots, dtype=torch.int64, device=device)


def sglang_req_to_token(state: Any, requests: Sequence[RequestId], width: int | None = None,
                        device: str | torch.device = "cpu") -> torch.Tensor:
    """SGLang's ``req_to_token`` rows for ``requests`` (positions past a request's end are 0)."""
    lengths = [_length(state, r) for r in requests]
    columns = max(lengths, default=0) if width is None else width
    table = torch.zeros((len(requests), columns), dtype=torch.int32)
    for index, request in enumerate(requests):
        if lengths[index] > columns:
            raise ValueError(f"request {request!r} maps {lengths[index]} tokens, more than {columns}")
        if lengths[index]:
            table[index, : lengths[index]] = torch.tensor(request_slots(state, request),
                                                          dtype=torch.int32)
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


# -- the sliding-window layers of a FULL + SWA hybrid -------------------------------------
def _peer_table(state: Any) -> torch.Tensor:
    """int64 ``[N + 1]``: the SWA page of every FULL page (0: none); ``ValueError`` without a pool."""
    pool = state.swa
    if pool is None:
        raise ValueError("the state has no SWA pool")
    table = torch.zeros(state.geometry.num_pages + 1, dtype=torch.int64)
    if len(pool.peer):
        table[torch.tensor(list(pool.peer.keys()))] = torch.tensor(list(pool.peer.values()))
    return table


def _translate(state: Any, full: torch.Tensor, mapping: torch.Tensor | None) -> torch.Tensor:
    if mapping is not None:
        return mapping[full.to(mapping.device)].cpu()
    size = state.geometry.page_size
    peer = _peer_table(state)[full // size]
    return torch.where(peer > 0, peer * size + full % size, 0)


def swa_slots(state: Any, full_slots: Sequence[int], mapping: torch.Tensor | None = None
              ) -> list[int]:
    """The SWA slot of each FULL slot: from the state's pairing, or read from ``mapping``
    (a ``full_to_swa_index_mapping`` tensor); 0 where the page has no SWA page."""
    full = torch.tensor(list(full_slots), dtype=torch.int64)
    return _translate(state, full, mapping).tolist()  # type: ignore[no-any-return]


def sglang_swa_req_to_token(state: Any, requests: Sequence[RequestId], width: int | None = None,
                            device: str | torch.device = "cpu",
                            mapping: torch.Tensor | None = None) -> torch.Tensor:
    """``sglang_req_to_token`` mapped through full -> SWA: the slot each position has in the
    SWA layers (0 where its SWA KV is gone, and past a request's end)."""
    table = sglang_req_to_token(state, requests, width).to(torch.int64)
    translated = _translate(state, table.reshape(-1), mapping).reshape(table.shape)
    return translated.to(torch.int32).to(device)


def swa_window_indices(state: Any, requests: Sequence[RequestId], window: int,
                       device: str | torch.device = "cpu", mapping: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(kv_indptr, kv_indices)``: the SWA slots of each request's last ``window`` positions.

    From the state's pairing a window position whose page has no SWA page
    raises :class:`SwaKVLost`; through ``mapping`` it reads what the mapping
    holds (a kernel's view).  A dangling window entry raises ``UseAfterFree``.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ValueError(f"window must be a positive int, got {window!r}")
    indptr = [0]
    full: list[int] = []
    starts: list[int] = []
    for request in requests:
        length = _length(state, request)
        start = max(0, length - window)
        starts.append(start)
        full.extend(request_slots(state, request, start, length))
        indptr.append(len(full))
    indices = _translate(state, torch.tensor(full, dtype=torch.int64), mapping)
    if mapping is None and len(full):
        lost = torch.nonzero(indices == 0).reshape(-1)
        if len(lost):
            row = int(lost[0])
            which = next(i for i in range(len(requests)) if indptr[i + 1] > row)
            raise SwaKVLost(requests[which], starts[which] + row - indptr[which],
                            full[row] // state.geometry.page_size)
    return (torch.tensor(indptr, dtype=torch.int32, device=device),
            indices.to(torch.int32).to(device))
