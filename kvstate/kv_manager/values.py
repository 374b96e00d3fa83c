"""The value store: where appended K/V vectors live (torch, via ``TorchExecutor``).

``ValueStore`` is the one adapter between the manager and the executor; the
manager never touches tensors itself.  It owns a ``TorchExecutor`` that
follows the manager's engine as a listener, so the executor moves the bytes
of every ``Copy`` event (copy-on-write) on its own; the store only writes
appended tokens and zeroes a newly registered prefix.  It uses the
executor's public API alone (constructor, ``attach``, ``set_kv_buffer``,
``get_kv_buffer``, ``layer_num``).

Layouts (the executor's buffers are ``[layers, (num_pages + 1) * P, heads, dim]``):

* basic mode: the manager's model config, ``page_size == 1``; the slot of a
  token is its reserved page and each layer writes its own buffer;
* paged mode: a one-layer config, ``page_size == P``; a core page is one
  layer's page, so every layer writes buffer 0 at its own page's slots.

Either way the buffers hold exactly the byte budget (plus the padding page),
allocated once when the store is built (at the manager's first append).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvstate.config import ModelConfig
from kvstate.engine import Engine
from kvstate.executor.buffers import TorchExecutor
from kvstate.kv_manager.errors import BufferAllocationError

DTYPE_BY_BYTES = {2: torch.float16, 4: torch.float32, 8: torch.float64}


STORABLE = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def storage_dtype(dtype: object, dtype_bytes: int) -> torch.dtype:
    """The dtype values are stored in: ``dtype`` if given, else float16/32/64 by ``dtype_bytes``.

    ``TypeError`` for anything but a floating torch dtype (an integer dtype would
    silently truncate every value); ``ValueError`` if its size is not ``dtype_bytes``.
    """
    if dtype is None:
        try:
            return DTYPE_BY_BYTES[dtype_bytes]
        except KeyError:
            raise ValueError(f"no default torch dtype for dtype_bytes={dtype_bytes}; "
                             "pass dtype= explicitly") from None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch dtype, got {dtype!r}")
    if dtype not in STORABLE:  # float8 types lack the fills and checks the store runs
        raise TypeError(f"dtype {dtype} cannot hold stored values here; use one of "
                        f"{', '.join(str(kind) for kind in STORABLE)}")
    size = torch.empty((), dtype=dtype).element_size()
    if size != dtype_bytes:
        raise ValueError(f"dtype {dtype} has {size} bytes per element; the model config "
                         f"says dtype_bytes={dtype_bytes}")
    return dtype


def storage_device(device: object) -> torch.device:
    """``device`` as a ``torch.device`` that exists here (``ValueError`` otherwise).

    ``None`` is the executor's default: CUDA when available, else the CPU.
    """
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a str or torch.device, got {type(device).__name__}")
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"unknown device {device!r}: {exc}") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} needs CUDA, which is not available")
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: only cpu and cuda are supported")
    return resolved


class ValueStore:
    """Owns the executor's buffers; ``write``/``zero_pages`` mutate them, ``read`` copies out."""

    def __init__(self, engine: Engine, config: ModelConfig, *, paged: bool,
                 dtype: torch.dtype, device: torch.device) -> None:
        geometry = engine.geometry
        self.paged = paged
        self.page_size = geometry.page_size
        self.dtype = dtype
        self.device = device
        buffer_config = config
        if paged:
            buffer_config = ModelConfig(1, config.num_kv_heads, config.head_dim,
                                        config.dtype_bytes, config.v_head_dim)
        nbytes = buffer_config.bytes_per_token * (geometry.num_pages + 1) * geometry.page_size
        try:
            self.executor = TorchExecutor(buffer_config, geometry.num_pages, geometry.page_size,
                                          dtype, device)
        except (RuntimeError, MemoryError) as exc:
            # torch reports a failed allocation as OutOfMemoryError (CUDA) or as a
            # RuntimeError naming the allocator (CPU); anything else is a real bug.
            if not isinstance(exc, (MemoryError, torch.OutOfMemoryError)) \
                    and "allocate" not in str(exc):
                raise
            raise BufferAllocationError(nbytes, str(device), exc) from exc
        self.executor.attach(engine)

    def _buffer_layer(self, layer: int) -> int:
        return 0 if self.paged else layer

    def write(self, layer: int, slot: int, key: torch.Tensor, value: torch.Tensor) -> None:
        """Store one checked ``[1, heads, dim]`` key and value at ``slot`` of ``layer``."""
        self.executor.set_kv_buffer(self._buffer_layer(layer), [slot], key, value)

    def read(self, layer: int, slots: Sequence[int]) -> tuple[list[list[float]], list[list[float]]]:
        """The rows at ``slots`` of ``layer`` as Python floats (a copy)."""
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
