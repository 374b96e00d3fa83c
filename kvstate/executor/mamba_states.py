"""The Mamba layers' state buffers of a hybrid model (SGLang's ``MambaPool`` layout).

``MambaStatePool`` owns its tensors and nothing else: which slot is whose is
core state (``State.mamba``) that its executor
(:mod:`kvstate.executor.mamba_executor`) mirrors.  Layout, for
``num_slots`` slots plus the dummy slot 0 (:mod:`kvstate.executor.mamba_config`)::

    conv_state[i] : [mamba layers, num_slots + 1, *conv_shapes[i]]   contiguous
    temporal_state: [mamba layers, num_slots + 1, *temporal_shape]   contiguous
    slot s of layer l = conv_state[i][l, s] and temporal_state[l, s]

All memory is allocated once, zeroed, in the constructor.  ``set_state``
and the executor's moves (``copy_slots``, ``poison_slots``) mutate the
tensors; the ``get_*`` calls return views.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvstate.executor.mamba_config import MambaStateConfig
from kvstate.executor.mirror import POISON

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class MambaStatePool:
    """Conv and SSM states of every Mamba layer for slots ``0..num_slots`` (0: the dummy)."""

    def __init__(self, config: MambaStateConfig, num_slots: int,
                 device: str | torch.device = "cpu") -> None:
        if not isinstance(config, MambaStateConfig):
            raise TypeError(f"MambaStatePool needs a MambaStateConfig, got {type(config).__name__}")
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots <= 0:
            raise ValueError(f"mamba num_slots must be a positive int, got {num_slots!r}")
        self.config = config
        self.num_slots = num_slots
        self.device = torch.device(device)
        self.layer_num = config.num_layers
        self.layers_mapping = config.layers_mapping
        rows = (config.num_layers, num_slots + 1)
        self.conv_state = [torch.zeros(rows + shape, dtype=DTYPES[config.conv_dtype],
                                       device=self.device) for shape in config.conv_shapes]
        self.temporal_state = torch.zeros(rows + config.temporal_shape,
                                          dtype=DTYPES[config.temporal_dtype], device=self.device)
        self.tensors = (*self.conv_state, self.temporal_state)

    @property
    def nbytes(self) -> int:
        """Bytes of every state tensor, the dummy slot included."""
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def layer_index(self, layer_id: Any) -> int:
        """The index in the state tensors of model layer ``layer_id`` (an id or an object
        with ``layer_id``); ``ValueError`` for a layer that is not a Mamba layer."""
        found = self.layers_mapping.get(int(getattr(layer_id, "layer_id", layer_id)))
        if found is None:
            raise ValueError(f"model layer {layer_id!r} is not one of the Mamba layers "
                             f"{list(self.config.layers)}")
        return found

    def layer_cache(self, layer_id: Any) -> tuple[list[torch.Tensor], torch.Tensor]:
        """``(conv states, SSM state)`` of one Mamba layer, ``[num_slots + 1, ...]`` views
        (what a Mamba kernel indexes with the batch's state indices)."""
        index = self.layer_index(layer_id)
        return [conv[index] for conv in self.conv_state], self.temporal_state[index]

    def get_state(self, slot: int) -> tuple[list[torch.Tensor], torch.Tensor]:
        """``(conv states, SSM state)`` of ``slot`` over every layer, ``[layers, ...]`` views."""
        row = int(self.slot_index([slot])[0])
        return [conv[:, row] for conv in self.conv_state], self.temporal_state[:, row]

    def set_state(self, layer_id: Any, slots: Any, conv: Sequence[torch.Tensor],
                  temporal: torch.Tensor) -> None:
        """A forward pass's write of one layer's states at ``slots`` (one value per state
        tensor, ``[len(slots), *shape]``); every value is shaped before any is written."""
        index = self.layer_index(layer_id)
        rows = self.slot_index(slots)
        if len(conv) != len(self.conv_state):
            raise ValueError(f"{len(conv)} conv states given, the layer has "
                             f"{len(self.conv_state)}")
        values = [value.to(target.dtype).reshape(len(rows), *target.shape[2:])
                  for target, value in zip(self.tensors, (*conv, temporal), strict=True)]
        for target, value in zip(self.tensors, values, strict=True):
            target[index, rows] = value

    def slot_index(self, slots: Any) -> torch.Tensor:
        """``slots`` as an int64 index on the pool's device (``IndexError`` outside 0..N)."""
        if isinstance(slots, list | tuple) and all(type(s) is int for s in slots):
            self._check_slots(slots)  # plain ints (what the plans hand over): no tensor reads
            return torch.tensor(slots, dtype=torch.int64, device=self.device)
        index = torch.as_tensor(slots, dtype=torch.int64, device=self.device).reshape(-1)
        if index.numel() and (int(index.min()) < 0 or int(index.max()) > self.num_slots):
            raise IndexError(f"Mamba slot index outside 0..{self.num_slots}")
        return index

    def _check_slots(self, slots: Sequence[int]) -> None:
        if slots and (min(slots) < 0 or max(slots) > self.num_slots):
            raise IndexError(f"Mamba slot index outside 0..{self.num_slots}")

    # -- moves the executor makes ----------------------------------------------------------
    def copy_slots(self, src_slots: Sequence[int], dst_slots: Sequence[int]) -> None:
        """Copy the states of ``src`` into ``dst`` (every layer, conv and SSM).  Sources are
        read before any destination is written."""
        if len(src_slots) != len(dst_slots):
            raise ValueError(f"{len(src_slots)} sources and {len(dst_slots)} destinations")
        if not len(src_slots):
            return
        if len(src_slots) == 1:
            src, dst = int(src_slots[0]), int(dst_slots[0])
            self._check_slots((src, dst))
            for tensor in self.tensors:
                tensor[:, dst].copy_(tensor[:, src], non_blocking=True)
            return
        source, target = self.slot_index(src_slots), self.slot_index(dst_slots)
        for tensor in self.tensors:
            tensor.index_copy_(1, target, tensor.index_select(1, source))

    def poison_slots(self, slots: Sequence[int]) -> None:
        """Fill ``slots`` with NaN in every state tensor (freed slots, in debug mode)."""
        if len(slots) == 1:
            slot = int(slots[0])
            self._check_slots((slot,))
            for tensor in self.tensors:
                tensor[:, slot].fill_(POISON)
        elif len(slots):
            index = self.slot_index(slots)
            for tensor in self.tensors:
                tensor.index_fill_(1, index, POISON)


__all__ = ["DTYPES", "MambaStatePool"]
