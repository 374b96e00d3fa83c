"""The value store: where appended K/V vectors live (torch, via ``TorchExecutor``).

``ValueStore`` is the one adapter between the manager and the executor; the
manager never touches tensors itself.  It owns a ``TorchExecutor`` that is
attached to the manager's engine, so the executor moves the bytes of every
``Copy`` event (copy-on-write) on its own.

Layouts (the executor's buffers are ``[layers, (num_pages + 1) * P, heads, dim]``):

* basic mode: the manager's model config, ``page_size == 1``; the slot of a
  token is its reserved page and each layer writes its own buffer;
* paged mode: a one-layer config, ``page_size == P``; a core page is one
  layer's page, so every layer writes buffer 0 at its own page's slots.

Either way the buffers hold exactly the byte budget (plus the padding page).
Values are stored in the configured dtype and read back as Python floats.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvstate.config import ModelConfig
from kvstate.engine import Engine
from kvstate.executor.buffers import TorchExecutor

DTYPE_BY_BYTES = {2: torch.float16, 4: torch.float32, 8: torch.float64}


def default_dtype(dtype_bytes: int) -> torch.dtype:
    """float16 for 2-byte configs, float32 for 4, float64 for 8 (else pass ``dtype``)."""
    try:
        return DTYPE_BY_BYTES[dtype_bytes]
    except KeyError:
        raise ValueError(f"no default torch dtype for dtype_bytes={dtype_bytes}; "
                         "pass dtype= explicitly") from None


class ValueStore:
    """Owns the executor's buffers; ``write``/``zero_pages`` mutate them, ``read`` copies out."""

    def __init__(self, engine: Engine, config: ModelConfig, *, paged: bool,
                 dtype: torch.dtype, device: str | torch.device | None) -> None:
        geometry = engine.state.geometry
        self.paged = paged
        self.page_size = geometry.page_size
        buffer_config = config
        if paged:
            buffer_config = ModelConfig(1, config.num_kv_heads, config.head_dim,
                                        config.dtype_bytes, config.v_head_dim)
        self.executor = TorchExecutor(buffer_config, geometry.num_pages, geometry.page_size,
                                      dtype, device)
        self.executor.attach(engine)

    def _buffer_layer(self, layer: int) -> int:
        return 0 if self.paged else layer

    def write(self, layer: int, slot: int, key: torch.Tensor, value: torch.Tensor) -> None:
        self.executor.set_kv_buffer(self._buffer_layer(layer), [slot], key, value)

    def read(self, layer: int, slots: Sequence[int]) -> tuple[list[list[float]], list[list[float]]]:
        keys, values = self.executor.get_kv_buffer(self._buffer_layer(layer))
        index = torch.as_tensor(list(slots), dtype=torch.int64, device=keys.device)
        count = len(slots)
        out_k = keys.index_select(0, index).reshape(count, -1).to("cpu", torch.float64)
        out_v = values.index_select(0, index).reshape(count, -1).to("cpu", torch.float64)
        return out_k.tolist(), out_v.tolist()

    def zero_pages(self, pages: Sequence[int]) -> None:
        """Fill ``pages`` with zeros in every layer buffer (a registered prefix starts empty)."""
        if not pages:
            return
        size = self.page_size
        slots = [page * size + offset for page in pages for offset in range(size)]
        for layer in range(self.executor.layer_num):
            keys, values = self.executor.get_kv_buffer(layer)
            index = torch.as_tensor(slots, dtype=torch.int64, device=keys.device)
            keys.index_fill_(0, index, 0)
            values.index_fill_(0, index, 0)
