"""The shapes of a hybrid model's Mamba states: ``MambaStateConfig`` (numbers only, no torch).

A Mamba (state-space) layer keeps one fixed-size recurrent state per sequence
instead of one KV entry per token.  SGLang's ``MambaPool`` holds, for every
Mamba layer and every slot, one or more convolution states and one SSM
("temporal") state; the executor's pool
(:class:`~kvstate.executor.mamba_states.MambaStatePool`) lays them out the
same way::

    conv_state[i] : [mamba layers, num_slots + 1, *conv_shapes[i]]   conv dtype
    temporal_state: [mamba layers, num_slots + 1, *temporal_shape]   temporal (SSM) dtype

Slot 0 is the dummy (SGLang's padding slot), so slots are ``1..num_slots``.
``layers`` are the model layer ids of the Mamba layers (SGLang's
``mamba_layer_ids``); index ``i`` of a state tensor is layer ``layers[i]``.
Dtypes are named (``"float32"``, ``"bfloat16"``, ``"float16"``), so this
module needs no torch; SGLang's defaults are a bfloat16 conv state and a
float32 SSM state.  :meth:`MambaStateConfig.mamba2` derives the shapes of a
Mamba2 mixer from its hyperparameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import attrs

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _dims(name: str, value: Sequence[int]) -> tuple[int, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or not value:
        raise ValueError(f"{name} must be a non-empty sequence of dimensions, got {value!r}")
    dims = tuple(value)
    for dim in dims:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
            raise ValueError(f"{name} holds {dim!r}, not a positive int")
    return dims


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


@attrs.frozen
class MambaStateConfig:
    """The Mamba layers of a model and the shape of one slot's state in each.

    Raises ``ValueError`` for no layer, a layer id twice, an empty or
    non-positive shape, or an unknown dtype name.
    """

    layers: tuple[int, ...]
    conv_shapes: tuple[tuple[int, ...], ...]
    temporal_shape: tuple[int, ...]
    conv_dtype: str = "bfloat16"
    temporal_dtype: str = "float32"

    def __attrs_post_init__(self) -> None:
        layers = self.layers
        if isinstance(layers, str | bytes) or not isinstance(layers, Sequence) or not layers:
            raise ValueError(f"layers must name at least one Mamba layer, got {layers!r}")
        for layer in layers:
            if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
                raise ValueError(f"layers holds {layer!r}, not a layer id (an int >= 0)")
        if len(set(layers)) != len(layers):
            raise ValueError(f"layers names a layer twice: {list(layers)}")
        shapes = self.conv_shapes
        if isinstance(shapes, str | bytes) or not isinstance(shapes, Sequence) or not shapes:
            raise ValueError(f"conv_shapes must hold at least one shape, got {shapes!r}")
        object.__setattr__(self, "layers", tuple(layers))
        object.__setattr__(self, "conv_shapes", tuple(_dims("conv shape", s) for s in shapes))
        object.__setattr__(self, "temporal_shape", _dims("temporal_shape", self.temporal_shape))
        for name in ("conv_dtype", "temporal_dtype"):
            if getattr(self, name) not in DTYPE_BYTES:
                raise ValueError(f"{name} must be one of {sorted(DTYPE_BYTES)}, got "
                                 f"{getattr(self, name)!r}")

    @classmethod
    def mamba2(cls, layers: Sequence[int], *, intermediate_size: int, n_groups: int,
               num_heads: int, head_dim: int, state_size: int, conv_kernel: int,
               conv_dtype: str = "bfloat16", temporal_dtype: str = "float32") -> MambaStateConfig:
        """A Mamba2 mixer's states (one tensor-parallel rank): the convolution runs over
        ``x``, ``B`` and ``C`` (``intermediate_size + 2 * n_groups * state_size`` channels)
        and keeps its last ``conv_kernel - 1`` inputs; the SSM state is
        ``[num_heads, head_dim, state_size]``."""
        channels = _positive("intermediate_size", intermediate_size) + 2 * _positive(
            "n_groups", n_groups) * _positive("state_size", state_size)
        window = _positive("conv_kernel", conv_kernel) - 1
        if window <= 0:
            raise ValueError("conv_kernel must be at least 2")
        return cls(tuple(layers), ((channels, window),),
                   (_positive("num_heads", num_heads), _positive("head_dim", head_dim),
                    state_size), conv_dtype, temporal_dtype)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def layers_mapping(self) -> dict[int, int]:
        """Model layer id -> index of the layer in the state tensors."""
        return {layer: index for index, layer in enumerate(self.layers)}

    @property
    def bytes_per_slot(self) -> int:
        """Bytes of one slot's state over every Mamba layer (conv and SSM)."""
        conv = sum(prod(shape) for shape in self.conv_shapes) * DTYPE_BYTES[self.conv_dtype]
        temporal = prod(self.temporal_shape) * DTYPE_BYTES[self.temporal_dtype]
        return (conv + temporal) * self.num_layers


__all__ = ["DTYPE_BYTES", "MambaStateConfig"]
