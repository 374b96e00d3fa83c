"""Executors of FULL + MAMBA hybrids: the attention layers' KV buffers plus a Mamba state pool.

``MambaTorchExecutor`` is a :class:`~kvstate.executor.buffers.TorchExecutor`
whose own buffers hold the attention layers (``model_config``; SGLang's
``HybridLinearKVPool`` full-attention pool) plus ``mamba_pool``, a
:class:`~kvstate.executor.mamba_states.MambaStatePool` of ``mamba_slots``
slots (SGLang's ``MambaPool``: every Mamba layer's conv and SSM state per
slot, slot 0 the dummy).  ``SwaMambaTorchExecutor`` does the same on a
:class:`~kvstate.executor.swa_executor.SwaTorchExecutor` (FULL + SWA + MAMBA).
Both follow an engine whose state has a Mamba pool of ``mamba_slots`` slots.

Byte moves of the Mamba events (:mod:`kvstate.executor.plan_mamba`), after
the batch commits like the KV ones: ``MambaCopy`` copies the source slot's
state into the destination slot (copy-on-match, a checkpoint's fork);
freed slots (``MambaFree``, ``MambaEvict``, ``Reset``) are poisoned (NaN)
with ``poison_freed``.  ``MambaAlloc``, ``MambaBind``, ``MambaDonate`` and
``MambaCommit`` hand a state to another owner without moving a byte: a
donated track slot or a committed slot *is* the state the tree keeps.
Who writes states is the forward pass (``mamba_pool.set_state``; in
integrity mode the monitor's ``write_state``).
"""

from __future__ import annotations

from typing import Any

import torch

from kvstate.config import ModelConfig
from kvstate.executor.buffers import TorchExecutor
from kvstate.executor.index_plan import IndexPlan
from kvstate.executor.mamba_config import MambaStateConfig
from kvstate.executor.mamba_states import MambaStatePool
from kvstate.executor.mirror import Mirror
from kvstate.executor.swa_config import SwaModelConfig
from kvstate.executor.swa_executor import SwaTorchExecutor


class MambaStates(Mirror):
    """The Mamba part of an executor (a base placed before the executor class it extends)."""

    mamba_pool: MambaStatePool
    mamba_config: MambaStateConfig

    @staticmethod
    def _check_mamba(config: MambaStateConfig, mamba_slots: int) -> None:
        """Refuse bad Mamba arguments before any buffer is allocated."""
        if not isinstance(config, MambaStateConfig):
            raise TypeError(f"a Mamba executor needs a MambaStateConfig, got "
                            f"{type(config).__name__}")
        if isinstance(mamba_slots, bool) or not isinstance(mamba_slots, int) or mamba_slots <= 0:
            raise ValueError(f"mamba_slots must be a positive int, got {mamba_slots!r}")

    def _init_mamba(self, config: MambaStateConfig, mamba_slots: int) -> None:
        self.mamba_config = config
        self.mamba_slots = mamba_slots
        self.mamba_pool = MambaStatePool(config, mamba_slots, self.device)

    def attach(self, engine: Any) -> None:
        """Follow ``engine``, whose state must have a Mamba pool of ``mamba_slots`` slots
        (``ValueError`` otherwise, nothing changed)."""
        tier = engine.view.mamba
        if tier is None or tier.num_slots != self.mamba_slots:
            have = "no Mamba pool" if tier is None else f"a Mamba pool of {tier.num_slots} slots"
            raise ValueError(f"the engine has {have}; the executor was built for "
                             f"{self.mamba_slots} Mamba slots")
        super().attach(engine)

    def _move(self, plan: IndexPlan) -> None:
        super()._move(plan)
        if plan.mamba_copy_src:
            self.mamba_pool.copy_slots(plan.mamba_copy_src, plan.mamba_copy_dst)
        if plan.mamba_freed and self.poison_freed:
            self.mamba_pool.poison_slots(plan.mamba_freed)

    def get_mamba_layer_cache(self, layer_id: Any) -> tuple[list[torch.Tensor], torch.Tensor]:
        """``(conv states, SSM state)`` of model layer ``layer_id``, ``[slots + 1, ...]`` views."""
        return self.mamba_pool.layer_cache(layer_id)

    @property
    def mamba_nbytes(self) -> int:
        """Bytes of the Mamba state pool (``nbytes`` stays the attention pool's)."""
        return self.mamba_pool.nbytes


class MambaTorchExecutor(MambaStates, TorchExecutor):
    """Attention K/V buffers for ``num_pages`` pages plus Mamba states for ``mamba_slots``."""

    def __init__(self, model_config: ModelConfig, mamba_config: MambaStateConfig,
                 num_pages: int, page_size: int, mamba_slots: int,
                 dtype: torch.dtype = torch.float16, device: str | torch.device | None = None,
                 *, poison_freed: bool = False) -> None:
        self._check_mamba(mamba_config, mamba_slots)
        super().__init__(model_config, num_pages, page_size, dtype, device,
                         poison_freed=poison_freed)
        self._init_mamba(mamba_config, mamba_slots)


class SwaMambaTorchExecutor(MambaStates, SwaTorchExecutor):
    """A :class:`SwaTorchExecutor` (full and sliding-window layers) plus Mamba states."""

    def __init__(self, config: SwaModelConfig, mamba_config: MambaStateConfig, num_pages: int,
                 page_size: int, swa_pages: int, mamba_slots: int,
                 dtype: torch.dtype = torch.float16, device: str | torch.device | None = None,
                 *, poison_freed: bool = False) -> None:
        self._check_mamba(mamba_config, mamba_slots)
        super().__init__(config, num_pages, page_size, swa_pages, dtype, device,
                         poison_freed=poison_freed)
        self._init_mamba(mamba_config, mamba_slots)


__all__ = ["MambaStates", "MambaTorchExecutor", "SwaMambaTorchExecutor"]
