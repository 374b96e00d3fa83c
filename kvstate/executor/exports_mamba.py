"""Reads of a FULL + MAMBA hybrid's Mamba states in the layouts SGLang's kernels consume.

A Mamba kernel reads one state per batch row: SGLang gathers
``req_index_to_mamba_index_mapping[req_pool_indices]`` (the running state
slot of each row; with the extra buffer also the ping-pong track slots from
``req_index_to_mamba_ping_pong_track_buffer_mapping``) and indexes the
``MambaPool`` tensors with it.  Index exports are pure functions of the state
(``State.mamba.rows``) returning fresh tensors; with ``mapping=`` (a front
end's mapping tensor) they return what a kernel would read through it, as it
is.  ``gather_mamba_states`` reads an executor's state tensors into fresh
tensors.  Nothing here mutates a state or a buffer::

    sglang_mamba_indices        int32 [n]: each row's running state slot
    sglang_mamba_track_indices  int64 [n, track slots]: each row's track slots (0: empty)
    gather_mamba_states         (conv states, SSM state) of given slots in one Mamba layer
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvstate.executor.exports import padded_rows
from kvstate.executor.read_errors import MambaStateLost
from kvstate.state import RequestId


def _tier(state: Any) -> Any:
    tier = state.mamba
    if tier is None:
        raise ValueError("the state has no Mamba pool")
    return tier


def _entries(state: Any, request: RequestId) -> tuple[int, ...]:
    tier = _tier(state)
    if request not in state.requests:
        raise KeyError(f"unknown request {request!r}")
    entries = tier.rows.get(request)
    if entries is None:
        raise MambaStateLost(request, "holds no Mamba slots")
    return tuple(entries)


def _through(mapping: torch.Tensor, requests: Sequence[RequestId]) -> torch.Tensor:
    rows = torch.tensor([int(r) for r in requests], dtype=torch.int64, device=mapping.device)
    return mapping[rows].cpu()


def sglang_mamba_indices(state: Any, requests: Sequence[RequestId],
                         device: str | torch.device = "cpu",
                         mapping: torch.Tensor | None = None) -> torch.Tensor:
    """SGLang's ``get_mamba_indices``: the running state slot of each request row.

    From the state, a row without a running slot raises :class:`MambaStateLost`;
    through ``mapping`` (``req_index_to_mamba_index_mapping``) the entries are
    returned as the kernel would read them, stale ones included.
    """
    if mapping is not None:
        _tier(state)
        return _through(mapping, requests).to(torch.int32).to(device)
    _tier(state)
    slots = []
    for request in requests:
        entries = _entries(state, request)
        if not entries[0]:
            raise MambaStateLost(request, "has no running state slot")
        slots.append(entries[0])
    return torch.tensor(slots, dtype=torch.int32, device=device)


def sglang_mamba_track_indices(state: Any, requests: Sequence[RequestId],
                               width: int | None = None, device: str | torch.device = "cpu",
                               mapping: torch.Tensor | None = None) -> torch.Tensor:
    """The ping-pong track slots of each request row (``[n, width]`` int64, 0: empty entry),
    SGLang's ``req_index_to_mamba_ping_pong_track_buffer_mapping`` rows; through ``mapping``
    as the kernel would read them."""
    if mapping is not None:
        _tier(state)
        return _through(mapping, requests).to(torch.int64).to(device)
    tracks = [_entries(state, request)[1:] for request in requests]
    return padded_rows(tracks, width, torch.int64, lambda index, length, columns: (
        f"request {requests[index]!r} has {length} track slots, more than {columns}")).to(device)


def gather_mamba_states(executor: Any, slots: Sequence[int] | torch.Tensor, layer_id: Any
                        ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``(conv states, SSM state)`` of ``slots`` in Mamba layer ``layer_id`` (a model layer
    id), fresh ``[n, ...]`` tensors in slot order (what a kernel reads for a batch)."""
    pool = executor.mamba_pool
    index = pool.slot_index(slots)
    conv, temporal = pool.layer_cache(layer_id)
    return [state.index_select(0, index) for state in conv], temporal.index_select(0, index)


__all__ = ["MambaStateLost", "gather_mamba_states", "sglang_mamba_indices",
           "sglang_mamba_track_indices"]
