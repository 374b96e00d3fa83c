"""K/V buffers of a FULL + SWA hybrid model (SGLang's ``SWAKVPool``): a pool per layer group.

``SwaTorchExecutor`` is a :class:`~kvstate.executor.buffers.TorchExecutor`
whose own buffers hold the full-attention layers (``num_pages`` pages; its
``k_buffer[i]``, ``get_kv_buffer(i)``, ``set_kv_buffer(i, ...)``,
``gather_kv`` index layer ``i`` of that group, like SGLang's
``full_kv_pool``), plus ``swa_pool``, a :class:`~kvstate.executor.swa_pool.SwaKVPool`
of ``swa_pages`` pages for the sliding-window layers.  Model layer ids go
through ``layers_mapping`` (``get_layer_kv_buffer``, ``set_layer_kv_buffer``).

``full_to_swa_index_mapping`` (int64, ``(N + 1) * P + 1`` entries, the last
-1, as SGLang's allocator shapes it) sends each FULL slot to the SWA slot at
the same offset of its page's SWA page, 0 (the padding sink) where the page
has none.  The executor keeps its own copy, written from the index plans of
the SWA events (:mod:`kvstate.executor.plan_swa`); ``register_mapping``
makes it read a front end's tensor instead (what SGLang's allocator does
with its KV pool), so a kernel's view of the pairing is the one exercised.
An SWA layer's write of FULL slot ``s`` lands at ``mapping[s]``.

Byte moves of the SWA events (after the batch commits, like the FULL ones):
freed SWA slots are poisoned with ``poison_freed``; a ``Copy`` of two paired
FULL pages copies their SWA pages; a ``SwaRebind`` moves no byte (the
mapping changes).  Allocated once, in the constructor.  No host tier (the
core has none beside an SWA pool: SGLang's hybrid runs without HiCache here).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from kvstate.events import Event
from kvstate.executor.buffers import TorchExecutor
from kvstate.executor.index_plan import IndexPlan
from kvstate.executor.swa_config import SwaModelConfig
from kvstate.executor.swa_pool import SwaKVPool


class SwaTorchExecutor(TorchExecutor):
    """Full-attention layers in the base buffers, sliding-window layers in ``swa_pool``."""

    def __init__(self, config: SwaModelConfig, num_pages: int, page_size: int, swa_pages: int,
                 dtype: torch.dtype = torch.float16, device: str | torch.device | None = None,
                 *, poison_freed: bool = False) -> None:
        if not isinstance(config, SwaModelConfig):
            raise TypeError(f"SwaTorchExecutor needs a SwaModelConfig, got {type(config).__name__}")
        if isinstance(swa_pages, bool) or not isinstance(swa_pages, int) or swa_pages <= 0:
            raise ValueError(f"swa_pages must be a positive int, got {swa_pages!r}")
        super().__init__(config.full_config, num_pages, page_size, dtype, device,
                         poison_freed=poison_freed)
        self.hybrid_config = config
        self.window = config.window
        self.layers_mapping = config.layers_mapping
        self.swa_pages = swa_pages
        self.swa_pool = SwaKVPool(config.swa_config, swa_pages, page_size, dtype, self.device)
        own = torch.zeros(self.rows + 1, dtype=torch.int64, device=self.device)
        own[-1] = -1
        self._own_mapping = own
        self.full_to_swa_index_mapping = own
        self._mapping_array: np.ndarray | None = own.numpy() if own.device.type == "cpu" else None

    # -- following an engine ------------------------------------------------------------
    def attach(self, engine: Any) -> None:
        """Follow ``engine``, whose state must have an SWA pool of ``swa_pages`` pages
        (``ValueError`` otherwise, nothing changed)."""
        view = engine.view
        pool = view.swa
        if pool is None or pool.num_pages != self.swa_pages:
            have = "no SWA pool" if pool is None else f"an SWA pool of {pool.num_pages} pages"
            raise ValueError(f"the engine has {have}; the executor was built for "
                             f"{self.swa_pages} SWA pages")
        super().attach(engine)
        self._rebuild_mapping(view)

    def before(self, event: Event, view: Any) -> None:
        """Plan ``event``; the first of a batch first tells the integrity monitor that the
        last decision is over (its forward pass wrote the SWA layers by now)."""
        if self.integrity is not None and not self._pending:
            self.integrity.between_decisions()
        super().before(event, view)

    def after(self, events: Sequence[Event], view: Any) -> None:
        """Move the batch's bytes; then tell the integrity monitor the batch is whole."""
        super().after(events, view)
        if self.integrity is not None:
            self.integrity.end_batch()

    def _move(self, plan: IndexPlan) -> None:
        super()._move(plan)
        if not plan.touches_swa:
            return
        if plan.swa_copy_src:
            self.swa_pool.copy_slots(plan.swa_copy_src, plan.swa_copy_dst)
        if plan.swa_unpaired:
            self._map_pages(plan.swa_unpaired, None)
        if plan.swa_paired:
            self._map_pages([full for full, _ in plan.swa_paired],
                            [page for _, page in plan.swa_paired])
        if plan.swa_freed_slots and self.poison_freed:
            self.swa_pool.poison_slots(plan.swa_freed_slots)

    # -- the full -> SWA mapping ------------------------------------------------------------
    def register_mapping(self, mapping: torch.Tensor) -> None:
        """Translate through ``mapping`` (a front end's ``full_to_swa_index_mapping``) from now on.

        It must be a 1-D int64 tensor of ``(num_pages + 1) * page_size + 1``
        entries; the executor's own copy is kept up to date beside it.
        """
        if not isinstance(mapping, torch.Tensor) or mapping.dtype != torch.int64 or \
                mapping.dim() != 1 or mapping.numel() != self.rows + 1:
            raise ValueError(f"full_to_swa_index_mapping must be a 1-D int64 tensor of "
                             f"{self.rows + 1} entries")
        self.full_to_swa_index_mapping = mapping

    @property
    def mapping_registered(self) -> bool:
        """Whether ``translate`` reads a front end's mapping (filled by the front end after
        its decision) rather than the executor's own (updated as each event is planned)."""
        return self.full_to_swa_index_mapping is not self._own_mapping

    def translate(self, full_slots: Sequence[int]) -> list[int]:
        """The SWA slots ``full_to_swa_index_mapping`` gives ``full_slots`` (0: no SWA page)."""
        mapping = self.full_to_swa_index_mapping
        if mapping is self._own_mapping and self._mapping_array is not None:
            array = self._mapping_array
        elif mapping.device.type == "cpu":
            array = mapping.numpy()
        else:
            index = torch.tensor(list(full_slots), dtype=torch.int64, device=mapping.device)
            return mapping[index].tolist()  # type: ignore[no-any-return]
        if len(full_slots) == 1:
            return [int(array[full_slots[0]])]
        return array[list(full_slots)].tolist()  # type: ignore[no-any-return]

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """SGLang's translation of a FULL index tensor (a -1 entry reads the trailing -1),
        on the mapping's device."""
        mapping = self.full_to_swa_index_mapping
        return mapping[kv_indices.to(device=mapping.device, dtype=torch.int64)]

    def _map_pages(self, pages: Sequence[int], peers: Sequence[int] | None) -> None:
        """Point every slot of FULL ``pages`` at their ``peers``' slots (None: at 0)."""
        size = self.page_size
        if size == 1:
            slots, values = list(pages), ([0] * len(pages) if peers is None else list(peers))
        else:
            slots = [page * size + k for page in pages for k in range(size)]
            values = ([0] * len(slots) if peers is None else
                      [page * size + k for page in peers for k in range(size)])
        if self._mapping_array is not None:
            self._mapping_array[slots] = values
        else:
            self._own_mapping[torch.tensor(slots, device=self.device)] = torch.tensor(
                values, dtype=torch.int64, device=self.device)

    def _rebuild_mapping(self, view: Any) -> None:
        self._own_mapping[:-1] = 0
        peer = view.swa.peer
        if len(peer):
            pages = list(peer.keys())
            self._map_pages(pages, [peer[page] for page in pages])

    # -- model layer ids ----------------------------------------------------------------------
    def layer_group(self, layer_id: int) -> tuple[int, bool]:
        """``(index inside its group, is an SWA layer)`` of model layer ``layer_id``."""
        found = self.layers_mapping.get(int(getattr(layer_id, "layer_id", layer_id)))
        if found is None:
            raise ValueError(f"model layer {layer_id!r} is not one of the "
                             f"{len(self.layers_mapping)} layers")
        return found

    def get_layer_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V buffers of model layer ``layer_id`` (its group's pool, rows = its slots)."""
        index, swa = self.layer_group(layer_id)
        return self.swa_pool.get_kv_buffer(index) if swa else self.get_kv_buffer(index)

    def set_layer_kv_buffer(self, layer: Any, loc: Any, cache_k: torch.Tensor,
                            cache_v: torch.Tensor, *, swa_loc: Any = None) -> None:
        """A forward pass's write of model layer ``layer`` (an id or an object with
        ``layer_id``) at FULL slots ``loc``: an SWA layer writes ``mapping[loc]`` (or the
        already translated ``swa_loc``)."""
        index, swa = self.layer_group(layer)
        if not swa:
            self.set_kv_buffer(index, loc, cache_k, cache_v)
            return
        if swa_loc is None:
            swa_loc = self.translate_loc_from_full_to_swa(self._slot_index(loc))
        self.swa_pool.set_kv_buffer(index, swa_loc, cache_k, cache_v)

    @property
    def swa_nbytes(self) -> int:
        """Bytes of the SWA pool (``nbytes`` is the full-attention pool's, as in ``TorchExecutor``)."""
        return self.swa_pool.nbytes


__all__ = ["SwaTorchExecutor"]
