"""Validation and conversion of the seed-002 API's key / value vectors.

Pure helpers for ``KVCacheManager``: they read the caller's vectors, never
mutate them, and return new tensors that are already in the value store's
dtype, device and row shape ``[1, heads, dim]``.  Every check happens here,
before the manager commits a single event, so a rejected vector changes
nothing and the write that follows the commit cannot fail on its input:

* ``TypeError``: not a list/tuple/tensor/array of real numbers (``str``,
  ``bool`` elements or a bool tensor, complex numbers, ``None`` ...);
* ``ValueError``: the wrong number of entries or the wrong shape (a tensor
  must be ``[width]`` or ``[heads, dim]``), a NaN or an infinity, or a
  finite number the storage dtype cannot hold (above 65504 in float16).
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Real
from typing import Any

import torch

from kvstate.config import ModelConfig

_INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _as_tensor(name: str, values: Any) -> torch.Tensor:
    """``values`` as a (still unchecked) tensor; ``TypeError`` for anything but real numbers."""
    if isinstance(values, torch.Tensor):
        tensor = values.detach()
    elif isinstance(values, (str, bytes)) or not (isinstance(values, Sequence)
                                                  or hasattr(values, "__array__")):
        raise TypeError(f"{name} must be a list of floats or a tensor, got {type(values).__name__}")
    elif isinstance(values, Sequence):
        for index, item in enumerate(values):
            if isinstance(item, bool) or not isinstance(item, Real):
                raise TypeError(f"{name}[{index}] must be a real number, got "
                                f"{type(item).__name__} {item!r}")
        try:
            tensor = torch.tensor(list(values), dtype=torch.float64)
        except OverflowError:  # an int too large for a float
            raise ValueError(f"{name} holds a number too large for a float") from None
    else:  # a numpy array or another array-like
        try:
            tensor = torch.as_tensor(values)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(f"{name} must hold real numbers: {exc}") from None
    if not (tensor.is_floating_point() or tensor.dtype in _INTEGER_DTYPES):
        raise TypeError(f"{name} must hold real numbers, got a {tensor.dtype} tensor")
    return tensor


def kv_vector(name: str, values: Any, heads: int, dim: int, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
    """``values`` as a ``[1, heads, dim]`` tensor of ``dtype`` on ``device``, every entry finite.

    It may share memory with a caller's tensor that needs no conversion: the
    manager only reads it (into the value buffers).
    """
    tensor = _as_tensor(name, values)
    width = heads * dim
    what = "head_dim" if name == "key" else "v_head_dim"
    if tensor.dim() == 1 and tensor.shape[0] != width:
        raise ValueError(f"{name} has {tensor.shape[0]} values; expected {width} "
                         f"(num_kv_heads * {what})")
    if tensor.dim() != 1 and tuple(tensor.shape) != (heads, dim):
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}; expected ({width},) or "
                         f"({heads}, {dim}) (num_kv_heads, {what})")
    stored = tensor.to(device=device, dtype=dtype).reshape(1, heads, dim)
    # One check on the stored copy catches NaN, infinities and overflow alike
    # (a NaN or an infinity stays one in any dtype); the message then tells which.
    if not bool(torch.isfinite(stored).all()):
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{name} holds a NaN or an infinity; a KV cache stores finite values")
        raise ValueError(f"{name} holds a value outside the {dtype} range "
                         f"(largest finite: {torch.finfo(dtype).max})")
    return stored


def kv_vectors(config: ModelConfig, key: Any, value: Any, dtype: torch.dtype,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One token's ``(key, value)`` for one layer, checked against ``config``'s head sizes."""
    heads = config.num_kv_heads
    return (kv_vector("key", key, heads, config.head_dim, dtype, device),
            kv_vector("value", value, heads, config.value_head_dim, dtype, device))
