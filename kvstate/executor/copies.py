"""Moving KV rows between buffers: run coalescing and integer-word copies.

Pure data-plane helpers over ``[layers, rows, ...]`` tensors.  ``copy_rows``
mutates its destination only; ``raw_words`` returns a view.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def slot_runs(src: Sequence[int], dst: Sequence[int]) -> list[tuple[int, int, int]]:
    """Coalesce parallel slot lists into ``(src_start, dst_start, length)`` runs."""
    runs: list[tuple[int, int, int]] = []
    for s, d in zip(src, dst, strict=True):
        if runs:
            rs, rd, n = runs[-1]
            if rs + n == s and rd + n == d:
                runs[-1] = (rs, rd, n + 1)
                continue
        runs.append((s, d, 1))
    return runs


def raw_words(tensor: torch.Tensor, leading: int = 2) -> torch.Tensor:
    """Reinterpret a contiguous tensor as ``[*shape[:leading], words]`` of the widest int type.

    Moves on integer words take torch's plain memcpy-like paths; half-precision
    strided copies do not.  Returns a view (no copy); writes go to ``tensor``.
    """
    trailing = 1
    for extent in tensor.shape[leading:]:
        trailing *= extent
    flat = tensor.reshape(*tensor.shape[:leading], trailing)
    row_bytes = flat.shape[-1] * flat.element_size()
    for dtype, width in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if row_bytes % width == 0 and flat.element_size() <= width:
            return flat.view(dtype)
    return flat.view(torch.uint8)


def copy_rows(dst: torch.Tensor, src: torch.Tensor, src_rows: Sequence[int],
              dst_rows: Sequence[int], max_runs: int = 1024) -> None:
    """``dst[:, dst_rows] = src[:, src_rows]`` over dim 1 of ``[layers, rows, ...]`` tensors.

    Contiguous runs are copied slice by slice on integer-word views (no
    temporary); very many short runs fall back to one gather plus one
    scatter.  Mutates ``dst`` only.
    """
    if len(src_rows) != len(dst_rows):
        raise ValueError(f"{len(src_rows)} source rows but {len(dst_rows)} destination rows")
    if not src_rows:
        return
    src_words, dst_words = raw_words(src), raw_words(dst)
    runs = slot_runs(src_rows, dst_rows)
    if len(runs) <= max_runs:
        for s, d, n in runs:
            dst_words[:, d:d + n].copy_(src_words[:, s:s + n], non_blocking=True)
        return
    src_index = torch.tensor(src_rows, dtype=torch.int64, device=src.device)
    dst_index = torch.tensor(dst_rows, dtype=torch.int64, device=dst.device)
    gathered = src_words.index_select(1, src_index)
    dst_words.index_copy_(1, dst_index, gathered.to(dst.device, non_blocking=True))
