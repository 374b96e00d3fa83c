"""Physical KV buffers that mirror the core's events (SGLang ``MHATokenToKVPool`` layout).

``TorchExecutor`` owns its tensors and nothing else: the core ``State`` says
what is where; the executor makes it true in memory.  All memory is allocated
once, in the constructor.  Layout (P = page size, N = num_pages)::

    _k : [num_layers, (N + 1) * P, num_kv_heads, head_dim]        contiguous
    _v : [num_layers, (N + 1) * P, num_kv_heads, value_head_dim]  contiguous
    k_buffer[layer] = _k[layer]   (a contiguous view, SGLang's per-layer buffer)
    rows 0..P-1 = page 0, the padding sink; page p = rows p*P .. p*P + P - 1

When ``value_head_dim == head_dim`` (the usual case) ``_k`` and ``_v`` are the
two halves of one ``[2 * num_layers, rows, heads, head_dim]`` allocation, K
layers first, so one page of every layer's K and V is a single strided view
(``2 * num_layers`` contiguous pieces) and a page copy is one copy.  Each
per-layer buffer is still its own contiguous ``[rows, heads, head_dim]``
block; ``page_views`` holds the per-page views the copies use.

``MLATorchExecutor`` (:mod:`kvstate.executor.mla`) keeps one latent buffer
per layer, ``kv_buffer[layer]`` of ``[rows, kv_lora_rank + qk_rope_head_dim]``.

Mutation: ``set_kv_buffer``, ``copy_pages``/``copy_slots``, ``poison_slots``
and the engine listener (:class:`~kvstate.executor.mirror.Mirror`, the base
class that follows an engine and moves the bytes of its events) write the
buffers; the ``get_*`` calls return views (no copy).
"""

from __future__ import annotations

from typing import Any

import torch

from kvstate.config import ModelConfig
from kvstate.executor.copies import PageViews
from kvstate.executor.copies import raw_words as raw_words  # re-exported
from kvstate.executor.mirror import POISON, Mirror
from kvstate.state import Geometry


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def kv_storage(config: ModelConfig, rows: int, dtype: torch.dtype, device: torch.device
               ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Zeroed ``(k, v, page_tensors)`` of ``config.num_layers`` layers of ``rows`` rows.

    With ``value_head_dim == head_dim`` K and V are the two halves of one
    ``[2 * layers, rows, heads, head_dim]`` allocation (K layers first), the
    one page tensor; otherwise two allocations, each its own page tensor.
    """
    layers, heads = config.num_layers, config.num_kv_heads
    if config.head_dim == config.value_head_dim:  # K and V in one allocation: one view per page
        pair = torch.zeros((2 * layers, rows, heads, config.head_dim), dtype=dtype, device=device)
        return pair[:layers], pair[layers:], [pair]
    k = torch.zeros((layers, rows, heads, config.head_dim), dtype=dtype, device=device)
    v = torch.zeros((layers, rows, heads, config.value_head_dim), dtype=dtype, device=device)
    return k, v, [k, v]


class TorchExecutor(Mirror):
    """MHA K/V buffers for ``num_pages`` pages of ``page_size`` tokens (plus page 0)."""

    def __init__(self, model_config: ModelConfig, num_pages: int, page_size: int,
                 dtype: torch.dtype = torch.float16, device: str | torch.device | None = None,
                 *, poison_freed: bool = False) -> None:
        self._init_mirror(Geometry(num_pages=num_pages, page_size=page_size))
        if element_size(dtype) != model_config.dtype_bytes:
            raise ValueError(f"dtype {dtype} has {element_size(dtype)} bytes per element; the "
                             f"model config plans {model_config.dtype_bytes}")
        self.model_config = model_config
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else default_device()
        self.page_size = page_size
        self.num_pages = num_pages
        self.poison_freed = poison_freed
        self.layer_num = model_config.num_layers
        self.head_num = model_config.num_kv_heads
        self.head_dim = model_config.head_dim
        self.v_head_dim = model_config.value_head_dim
        rows = (num_pages + 1) * page_size
        self.rows = rows
        self._k, self._v, page_tensors = kv_storage(model_config, rows, dtype, self.device)
        self.row_buffers = (self._k, self._v)
        self.k_buffer = [self._k[layer] for layer in range(self.layer_num)]
        self.v_buffer = [self._v[layer] for layer in range(self.layer_num)]
        self.page_views = PageViews(page_tensors, page_size)
        self._check_capacity()

    # -- sizes ------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes of all K and V buffers, the padding page included."""
        return self._k.numel() * self._k.element_size() + self._v.numel() * self._v.element_size()

    @property
    def usable_bytes(self) -> int:
        """Bytes of pages 1..N (the pool SGLang's capacity planning sizes)."""
        return self.nbytes - self.model_config.bytes_per_page(self.page_size)

    def _check_capacity(self) -> None:
        config = self.model_config
        expected = config.bytes_per_token * self.rows
        if self.nbytes != expected:
            raise AssertionError(f"buffers hold {self.nbytes} bytes, capacity planning says {expected}")
        if config.max_pages(self.usable_bytes, self.page_size) != self.num_pages:
            raise AssertionError("usable bytes do not fit exactly num_pages pages")

    # -- SGLang's read/write API -------------------------------------------------
    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[layer_id]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffer[layer_id], self.v_buffer[layer_id]

    def set_kv_buffer(self, layer: Any, loc: Any, cache_k: torch.Tensor,
                      cache_v: torch.Tensor) -> None:
        """``k_buffer[layer][loc] = cache_k`` and the same for V (a data-plane write).

        ``layer`` is a layer index or an object with ``layer_id`` (SGLang's
        ``RadixAttention``).  Mutates the buffers; the state does not change.
        """
        layer_id = int(getattr(layer, "layer_id", layer))
        index = self._slot_index(loc)
        self.k_buffer[layer_id][index] = cache_k.to(self.dtype).reshape(-1, self.head_num, self.head_dim)
        self.v_buffer[layer_id][index] = cache_v.to(self.dtype).reshape(
            -1, self.head_num, self.v_head_dim)


__all__ = ["POISON", "TorchExecutor", "default_device", "element_size", "kv_storage", "raw_words"]
