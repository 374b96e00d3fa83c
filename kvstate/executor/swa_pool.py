"""The sliding-window layers' K/V buffers of a FULL + SWA hybrid (SGLang's ``swa_kv_pool``).

``SwaKVPool`` owns its tensors and nothing else; which SWA page serves which
FULL page is core state (``State.swa.peer``) that its executor
(:class:`~kvstate.executor.swa_executor.SwaTorchExecutor`) mirrors.  Layout
like the full pool's (:mod:`kvstate.executor.buffers`), over ``swa_pages``
pages of the same page size::

    _k : [swa layers, (M + 1) * P, num_kv_heads, head_dim]   (K and V in one allocation
    _v : [swa layers, (M + 1) * P, num_kv_heads, v_head_dim]  when the head sizes agree)
    k_buffer[i] = _k[i]      i = index of the layer inside the SWA group
    rows 0..P-1 = SWA page 0, the padding sink (an unpaired FULL slot translates to slot 0)

All memory is allocated once, in the constructor.  ``set_kv_buffer`` and the
executor's moves (``copy_slots``, ``poison_slots``) mutate the buffers; the
``get_*`` calls return views.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvstate.config import ModelConfig
from kvstate.executor.buffers import kv_storage
from kvstate.executor.copies import PageViews, copy_slots_within, whole_pages
from kvstate.executor.mirror import POISON


class SwaKVPool:
    """K/V buffers of the SWA layers for ``num_pages`` pages of ``page_size`` tokens (plus page 0)."""

    def __init__(self, config: ModelConfig, num_pages: int, page_size: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages <= 0:
            raise ValueError(f"swa_pages must be a positive int, got {num_pages!r}")
        self.config = config
        self.num_pages = num_pages
        self.page_size = page_size
        self.dtype = dtype
        self.device = device
        self.layer_num = config.num_layers
        self.head_num = config.num_kv_heads
        self.head_dim = config.head_dim
        self.v_head_dim = config.value_head_dim
        self.rows = (num_pages + 1) * page_size
        self._k, self._v, page_tensors = kv_storage(config, self.rows, dtype, device)
        self.row_buffers = (self._k, self._v)
        self.k_buffer = [self._k[layer] for layer in range(self.layer_num)]
        self.v_buffer = [self._v[layer] for layer in range(self.layer_num)]
        self.page_views = PageViews(page_tensors, page_size)

    @property
    def nbytes(self) -> int:
        """Bytes of the SWA K and V buffers, the padding page included."""
        return sum(t.numel() * t.element_size() for t in self.page_views.tensors)

    def get_key_buffer(self, index: int) -> torch.Tensor:
        return self.k_buffer[index]

    def get_value_buffer(self, index: int) -> torch.Tensor:
        return self.v_buffer[index]

    def get_kv_buffer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffer[index], self.v_buffer[index]

    def set_kv_buffer(self, index: int, swa_loc: Any, cache_k: torch.Tensor,
                      cache_v: torch.Tensor) -> None:
        """``k_buffer[index][swa_loc] = cache_k`` and the same for V (SWA slots, translated)."""
        rows = self.slot_index(swa_loc)
        self.k_buffer[index][rows] = cache_k.to(self.dtype).reshape(-1, self.head_num, self.head_dim)
        self.v_buffer[index][rows] = cache_v.to(self.dtype).reshape(-1, self.head_num,
                                                                    self.v_head_dim)

    def slot_index(self, slots: Any) -> torch.Tensor:
        """``slots`` as an int64 index on the pool's device (``IndexError`` outside the pool)."""
        index = torch.as_tensor(slots, dtype=torch.int64, device=self.device).reshape(-1)
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= self.rows):
            raise IndexError(f"SWA slot index outside 0..{self.rows - 1}")
        return index

    # -- moves the executor makes --------------------------------------------------------
    def copy_slots(self, src_slots: Sequence[int], dst_slots: Sequence[int]) -> None:
        """Copy SWA rows ``src -> dst`` in every SWA layer (whole pages take the page path)."""
        copy_slots_within(self.page_views, self.row_buffers, src_slots, dst_slots)

    def poison_slots(self, slots: Sequence[int]) -> None:
        """Fill ``slots`` with NaN in every SWA layer (freed SWA slots, in debug mode)."""
        pages = whole_pages(slots, self.page_size)
        if pages is None:
            index = self.slot_index(slots)
            for tensor in self.row_buffers:
                tensor.index_fill_(1, index, POISON)
            return
        self.page_views.fill(pages, POISON)


__all__ = ["SwaKVPool"]
