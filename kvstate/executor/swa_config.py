"""Which layers of a FULL + SWA hybrid model attend fully and which through a sliding window.

``SwaModelConfig`` owns nothing but numbers: the per-layer KV geometry (a
``ModelConfig`` whose ``num_layers`` counts every attention layer of the
model), the model layer ids of the full-attention and of the sliding-window
layers (together exactly ``0 .. num_layers - 1``), and the window in tokens.
Each layer group gets its own pool (:class:`~kvstate.executor.swa_executor.SwaTorchExecutor`):
the full layers one of ``num_pages`` pages, the SWA layers one of ``swa_pages``.
Pure: no torch.

``window`` may be ``None`` where it is not known (a replayed log that does
not record it): the buffers do not need it, only the integrity monitor's
"every token of a request's last window has its SWA KV" check does.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from kvstate.config import ModelConfig


def _layer_ids(name: str, value: Sequence[int]) -> tuple[int, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ValueError(f"{name} must be a sequence of layer ids, got {value!r}")
    ids = tuple(value)
    for layer in ids:
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
            raise ValueError(f"{name} holds {layer!r}, not a layer id (an int >= 0)")
    if len(set(ids)) != len(ids):
        raise ValueError(f"{name} names a layer twice: {list(ids)}")
    return ids


@attrs.frozen
class SwaModelConfig:
    """A hybrid model's layer groups: ``full_layers`` and ``swa_layers`` of ``model``.

    Both groups must be non-empty (a model with no SWA layer is a plain
    ``TorchExecutor``'s) and together name every layer once.  Raises
    ``ValueError`` for anything else.
    """

    model: ModelConfig
    full_layers: tuple[int, ...]
    swa_layers: tuple[int, ...]
    window: int | None = None

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.model, ModelConfig):
            raise ValueError(f"model must be a ModelConfig, got {self.model!r}")
        full = _layer_ids("full_layers", self.full_layers)
        swa = _layer_ids("swa_layers", self.swa_layers)
        object.__setattr__(self, "full_layers", full)  # lists given are kept as tuples
        object.__setattr__(self, "swa_layers", swa)
        if not full or not swa:
            raise ValueError("a hybrid model needs at least one full-attention and one "
                             "sliding-window layer")
        both = set(full) | set(swa)
        if len(both) != len(full) + len(swa):
            raise ValueError(f"layers {sorted(set(full) & set(swa))} are both full and SWA")
        if both != set(range(self.model.num_layers)):
            raise ValueError(f"full_layers and swa_layers must name layers 0..."
                             f"{self.model.num_layers - 1} once each, got {sorted(both)}")
        window = self.window
        if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                                   or window <= 0):
            raise ValueError(f"window must be a positive int (tokens) or None, got {window!r}")

    @property
    def full_config(self) -> ModelConfig:
        """The geometry of the full-attention group (``num_layers`` = its layer count)."""
        return attrs.evolve(self.model, num_layers=len(self.full_layers))

    @property
    def swa_config(self) -> ModelConfig:
        """The geometry of the sliding-window group."""
        return attrs.evolve(self.model, num_layers=len(self.swa_layers))

    @property
    def layers_mapping(self) -> dict[int, tuple[int, bool]]:
        """Model layer id -> (index inside its group, whether the group is the SWA one)."""
        mapping = {layer: (index, False) for index, layer in enumerate(self.full_layers)}
        mapping.update({layer: (index, True) for index, layer in enumerate(self.swa_layers)})
        return mapping

    def bytes_per_page(self, page_size: int) -> tuple[int, int]:
        """``(full, swa)`` bytes of one page of each pool (all of its layers, K and V)."""
        return self.full_config.bytes_per_page(page_size), self.swa_config.bytes_per_page(page_size)


__all__ = ["SwaModelConfig"]
