"""MLA latent KV buffers (DeepSeek-V2 style), SGLang ``MLATokenToKVPool`` layout.

``MLATorchExecutor`` owns one ``[layers, (N + 1) * P, kv_lora_rank + qk_rope_head_dim]``
tensor; ``kv_buffer[layer]`` is a view of it.  The value is the first
``kv_lora_rank`` columns of the latent row.  Same event following as
``TorchExecutor``; allocated once in the constructor.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from kvstate.executor.buffers import default_device, element_size
from kvstate.executor.copies import PageViews
from kvstate.executor.mirror import Mirror
from kvstate.state import Geometry


@attrs.frozen
class MLAConfig:
    """Per-token latent KV geometry of an MLA model (DeepSeek-V2 style)."""

    num_layers: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    dtype_bytes: int = 2

    @property
    def row_width(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def bytes_per_token(self) -> int:
        return self.num_layers * self.row_width * self.dtype_bytes


class MLATorchExecutor(Mirror):
    """One latent buffer per layer: ``kv_buffer[layer]`` of ``[rows, lora + rope]``."""

    def __init__(self, config: MLAConfig, num_pages: int, page_size: int,
                 dtype: torch.dtype = torch.float16, device: str | torch.device | None = None,
                 *, poison_freed: bool = False) -> None:
        self._init_mirror(Geometry(num_pages=num_pages, page_size=page_size))
        if element_size(dtype) != config.dtype_bytes:
            raise ValueError(f"dtype {dtype} does not have {config.dtype_bytes} bytes per element")
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else default_device()
        self.page_size = page_size
        self.num_pages = num_pages
        self.poison_freed = poison_freed
        self.layer_num = config.num_layers
        self.kv_lora_rank = config.kv_lora_rank
        self.rows = (num_pages + 1) * page_size
        self._kv = torch.zeros((self.layer_num, self.rows, config.row_width), dtype=dtype,
                               device=self.device)
        self.row_buffers = (self._kv,)
        self.kv_buffer = [self._kv[layer] for layer in range(self.layer_num)]
        self.page_views = PageViews([self._kv], page_size)
        if self.nbytes != config.bytes_per_token * self.rows:
            raise AssertionError("latent buffer size differs from the MLA capacity plan")

    @property
    def nbytes(self) -> int:
        return self._kv.numel() * self._kv.element_size()

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[layer_id][..., : self.kv_lora_rank]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def set_kv_buffer(self, layer: Any, loc: Any, cache_k: torch.Tensor,
                      cache_v: torch.Tensor | None = None) -> None:
        """Write the latent rows ``cache_k`` (``cache_v`` is unused, as in SGLang's MLA pool)."""
        layer_id = int(getattr(layer, "layer_id", layer))
        index = self._slot_index(loc)
        self.kv_buffer[layer_id][index] = cache_k.to(self.dtype).reshape(-1, self.config.row_width)
