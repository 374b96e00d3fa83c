"""Integrity tags: the deterministic K/V pattern a computed token holds in integrity mode.

A tag is a row of small integers in ``[-128, 127]`` (exact in fp16/bf16/fp32)
derived from ``(writer uid, position, layer)``.  A ``Content`` names the
``(writer uid, position the KV was computed for)`` whose tag a slot should
hold; the null uid (block mode) stands for whatever the padding page holds.

Ownership: nothing here keeps state.  ``tag_values`` is pure;
``expected_tags`` reads the executor (its shapes, dtype and, for null-page
rows, its padding page) and returns new tensors; ``write_tags`` mutates only
the executor's K/V buffers, through ``set_kv_buffer``.  The bookkeeping of
which slot should hold which content belongs to
:class:`~kvstate.executor.integrity.IntegrityMonitor`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvstate.executor.integrity_block import NULL_UID, Content
from kvstate.executor.mla import MLATorchExecutor

__all__ = ["Content", "TagRows", "expected_tags", "tag_values", "write_tags"]

_M1, _M2, _M3 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
_M4, _M5 = 0x27D4EB2F, 0x165667B1


def tag_values(uids: torch.Tensor, positions: torch.Tensor, layer: int, width: int,
               salt: int) -> torch.Tensor:
    """``[n, width]`` int64 tags in ``[-128, 127]`` for ``(uid, position)`` pairs (pure)."""
    h = uids * _M1 + positions * _M2 + (layer * 4 + salt + 1) * _M3
    h = h ^ (h >> 15)
    columns = torch.arange(width, dtype=torch.int64, device=uids.device) * _M4 + _M5
    x = h[:, None] ^ columns[None, :]
    x = x * _M2
    x = x ^ (x >> 13)
    x = x * _M3
    x = x ^ (x >> 16)
    return (x & 255) - 128


class TagRows:
    """``contents`` as index tensors on ``device``, built once and read for every layer.

    ``null`` (indices into ``contents``) and ``null_rows`` (their padding
    rows) are ``None`` when no content is a null-page position; that is
    decided on the host, so the per-layer work never waits for the device.
    Owns only its tensors.
    """

    __slots__ = ("uids", "positions", "null", "null_rows")

    def __init__(self, contents: Sequence[Content], device: torch.device) -> None:
        self.uids = torch.tensor([c[0] for c in contents], dtype=torch.int64, device=device)
        self.positions = torch.tensor([c[1] for c in contents], dtype=torch.int64, device=device)
        null = [index for index, c in enumerate(contents) if c[0] == NULL_UID]
        self.null: torch.Tensor | None = None
        self.null_rows: torch.Tensor | None = None
        if null:
            self.null = torch.tensor(null, dtype=torch.int64, device=device)
            self.null_rows = torch.tensor([contents[i][1] for i in null], dtype=torch.int64,
                                          device=device)


def expected_tags(executor: Any, contents: Sequence[Content] | TagRows,
                  layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Expected ``(k, v)`` rows for ``contents`` in one layer, in the buffers' dtype.

    Pass a :class:`TagRows` to reuse its index tensors across layers.
    """
    ex = executor
    rows = contents if isinstance(contents, TagRows) else TagRows(contents, ex.device)
    uids, positions = rows.uids, rows.positions
    if isinstance(ex, MLATorchExecutor):
        k = tag_values(uids, positions, layer, ex.config.row_width, 0).to(ex.dtype)
        v = k[:, : ex.kv_lora_rank]
    else:
        k = tag_values(uids, positions, layer, ex.head_num * ex.head_dim, 0).to(ex.dtype).view(
            -1, ex.head_num, ex.head_dim)
        v = tag_values(uids, positions, layer, ex.head_num * ex.v_head_dim, 1).to(ex.dtype).view(
            -1, ex.head_num, ex.v_head_dim)
    if rows.null is not None and rows.null_rows is not None:
        # null-page positions read the padding page as it is
        k_buf, v_buf = ex.get_kv_buffer(layer)
        k[rows.null] = k_buf.index_select(0, rows.null_rows)
        if not isinstance(ex, MLATorchExecutor):
            v[rows.null] = v_buf.index_select(0, rows.null_rows)
    return k, v


def write_tags(executor: Any, slots: Sequence[int], contents: Sequence[Content]) -> None:
    """Write the tags of ``contents`` at ``slots`` in every layer (the forward pass's writes)."""
    if not slots:
        return
    rows = TagRows(contents, executor.device)
    index = torch.tensor(list(slots), dtype=torch.int64, device=executor.device)
    for layer in range(executor.layer_num):
        k, v = expected_tags(executor, rows, layer)
        executor.set_kv_buffer(layer, index, k, v)
