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
and ``apply`` write the buffers; the ``get_*`` calls return views (no copy).
The executor follows the reducer: ``apply(event)`` computes the index plan
(:mod:`kvstate.executor.plan`) and moves bytes; it never decides anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvstate.config import ModelConfig
from kvstate.events import Event
from kvstate.executor.copies import (
    PageViews,
    copy_pages_between,
    copy_slots_within,
    raw_words,  # re-exported: ``from kvstate.executor.buffers import raw_words``
)
from kvstate.executor.plan import IndexPlan, plan_indices
from kvstate.executor.plan_host import plan_tiered_indices
from kvstate.reducer import apply as reduce
from kvstate.reducer.host import apply_tiered
from kvstate.state import Geometry, State, initial_state
from kvstate.state_host import HostTier, TieredState, empty_host_tier

POISON = float("nan")


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class _Mirror:
    """Follows a state and its events and moves the bytes; subclasses own the buffers.

    A subclass sets ``row_buffers`` (its ``[layers, rows, ...]`` tensors: K
    then V, or the one latent tensor) and ``page_views`` (per-page views of
    the tensors that hold them) in its constructor.
    """

    geometry: Geometry
    device: torch.device
    poison_freed: bool
    listeners: list[Any]
    row_buffers: tuple[torch.Tensor, ...]
    page_views: PageViews

    def _init_mirror(self, geometry: Geometry) -> None:
        self.geometry = geometry
        self.state: State = initial_state(geometry)
        self.listeners = []
        self.host_pool: Any = None
        self.tier: HostTier | None = None

    # -- host tier -------------------------------------------------------------
    def enable_host(self, host_pool: Any, tier: HostTier | None = None) -> None:
        """Follow a host tier as well: events then go through the tiered reducer.

        ``host_pool`` (a ``HostPool``) holds the host bytes; ``tier`` the
        host bookkeeping to start from (empty by default).
        """
        tier = empty_host_tier(host_pool.num_pages) if tier is None else tier
        if tier.num_pages != host_pool.num_pages:
            raise ValueError(f"host tier has {tier.num_pages} pages, the pool {host_pool.num_pages}")
        self.host_pool = host_pool
        self.tier = tier

    @property
    def tiered_state(self) -> TieredState:
        if self.tier is None:
            raise RuntimeError("the executor has no host tier (call enable_host first)")
        return TieredState(self.state, self.tier)

    # -- following the core ----------------------------------------------------
    def attach(self, engine: Any) -> None:
        """Adopt ``engine``'s state and subscribe to its events (called by the allocators)."""
        geometry = engine.state.geometry
        if (geometry.num_pages, geometry.page_size) != (self.geometry.num_pages,
                                                         self.geometry.page_size):
            raise ValueError(f"engine has {geometry.num_pages} pages of {geometry.page_size}; "
                             f"the executor was built for {self.geometry.num_pages} pages of "
                             f"{self.geometry.page_size}")
        self.geometry = geometry
        self.state = engine.state
        engine.subscribe(self.on_event)

    def reset_state(self, state: State) -> None:
        """Start following ``state`` (buffers are left as they are)."""
        if (state.geometry.num_pages, state.geometry.page_size) != (self.geometry.num_pages,
                                                                     self.geometry.page_size):
            raise ValueError("state geometry does not match the executor's buffers")
        self.geometry = state.geometry
        self.state = state

    def on_event(self, event: Event, state_after: State) -> None:
        """Engine listener: ``event`` took the last seen state to ``state_after``."""
        self.apply(event, None if self.tier is not None else state_after)

    def apply(self, event: Event, state_after: State | TieredState | None = None) -> IndexPlan:
        """Move the bytes ``event`` implies; returns the index plan it followed.

        ``state_after`` defaults to the pure reducer's result (the tiered
        reducer's once a host tier is enabled), which raises ``InvalidEvent``
        and changes nothing on a bad event.
        """
        if self.tier is not None:
            tiered_before = TieredState(self.state, self.tier)
            tiered_after = (apply_tiered(tiered_before, event) if state_after is None
                            else state_after)
            if not isinstance(tiered_after, TieredState):
                raise TypeError("with a host tier, state_after must be a TieredState")
            plan = plan_tiered_indices(tiered_before, tiered_after, event)
            before, after = self.state, tiered_after.core
            self._move(plan)
            self.state, self.tier = after, tiered_after.host
        else:
            before = self.state
            core_after = reduce(before, event) if state_after is None else state_after
            if not isinstance(core_after, State):
                raise TypeError("without a host tier, state_after must be a State")
            after = core_after
            plan = plan_indices(before, after, event)
            self._move(plan)
            self.state = after
        for listener in self.listeners:
            listener(event, before, after, plan)
        return plan

    def _move(self, plan: IndexPlan) -> None:
        if plan.copy_src:
            self.copy_slots(plan.copy_src, plan.copy_dst)
        if plan.host_out_src:
            self.host_pool.offload_slots(plan.host_out_src, plan.host_out_dst)
        if plan.host_in_src:
            self.host_pool.load_slots(plan.host_in_src, plan.host_in_dst)
        if plan.freed_slots and self.poison_freed:
            self.poison_slots(plan.freed_slots)

    # -- data movement -------------------------------------------------------------
    def copy_slots(self, src_slots: Sequence[int], dst_slots: Sequence[int]) -> None:
        """Copy rows ``src -> dst`` in every buffer and layer (``move_kv_cache``).

        Whole pages in order take the page path (:meth:`copy_pages`).
        """
        copy_slots_within(self.page_views, self.row_buffers, src_slots, dst_slots)

    def copy_pages(self, src_pages: Sequence[int], dst_pages: Sequence[int]) -> None:
        """Copy whole pages ``src -> dst`` (every buffer and layer); list order is kept if they overlap."""
        copy_pages_between(self.page_views, self.page_views, src_pages, dst_pages)

    def poison_slots(self, slots: Sequence[int]) -> None:
        """Fill ``slots`` with NaN in every buffer and layer (debug aid for freed slots)."""
        index = self._slot_index(slots)
        for tensor in self.row_buffers:
            tensor.index_fill_(1, index, POISON)

    # -- reads in kernel layouts -----------------------------------------------------
    def gather_kv(self, state: State, request: Any, layer: int,
                  out: tuple[torch.Tensor, torch.Tensor] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """A request's K/V in one layer, contiguous in token order (see ``exports.gather_kv``)."""
        from kvstate.executor.exports import gather_kv

        return gather_kv(self, state, request, layer, out)

    def _slot_index(self, slots: Any) -> torch.Tensor:
        index = torch.as_tensor(slots, dtype=torch.int64, device=self.device).reshape(-1)
        rows = (self.geometry.num_pages + 1) * self.geometry.page_size
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= rows):
            raise IndexError(f"slot index outside 0..{rows - 1}")
        return index


class TorchExecutor(_Mirror):
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
        page_tensors: list[torch.Tensor]
        if self.head_dim == self.v_head_dim:  # K and V in one allocation: one view per page
            pair = torch.zeros((2 * self.layer_num, rows, self.head_num, self.head_dim),
                               dtype=dtype, device=self.device)
            self._k, self._v = pair[: self.layer_num], pair[self.layer_num:]
            page_tensors = [pair]
        else:
            self._k = torch.zeros((self.layer_num, rows, self.head_num, self.head_dim),
                                  dtype=dtype, device=self.device)
            self._v = torch.zeros((self.layer_num, rows, self.head_num, self.v_head_dim),
                                  dtype=dtype, device=self.device)
            page_tensors = [self._k, self._v]
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


__all__ = ["POISON", "TorchExecutor", "default_device", "element_size", "raw_words"]
