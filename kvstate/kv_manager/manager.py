"""``KVCacheManager``: seed 002's public API on the event-sourced core.

Ownership: the manager owns an ``Engine`` (``.engine``; the one mutable
cell), the mode it chose, the prefix-cache switch and a lazily built
``ValueStore`` (the torch executor holding the K/V values).  Every fact about
reservations, pages, sharing, copies and prefix retention is core state,
changed only by events that the pure planners in this package compute; the
manager keeps no other bookkeeping.  Each public call either commits one
plan (all its events) or raises / returns ``False`` having changed nothing.

Modes (``modes.py``): the first allocation call picks basic (``allocate``)
or paged (``allocate_paged`` / ``enable_prefix_cache``) sizing for the
manager's lifetime, or pass ``mode=``; the other mode's calls raise
``ModeError``.  Attach a log recorder after that choice (it configures the
engine's geometry).  Key / value checks live in ``vectors.py``.

Core request ids (see ``names.py``): one anchor ``req/<id>`` per seed request
plus one table ``L<layer>/<id>`` per layer.  Per-layer tables, rather than
one table with per-layer sections, because the seed's layers fill at
different rates and its pages belong to one layer: a core ``Request``'s
``committed`` is then exactly "tokens stored in this layer" and its page
table exactly the seed's ``(request, layer, logical page) -> page`` map.
"""

from __future__ import annotations

from typing import Any

import torch

from kvstate.config import ModelConfig
from kvstate.engine import Engine
from kvstate.kv_manager import basic, paged, sharing
from kvstate.kv_manager.checks import check_count as _count
from kvstate.kv_manager.checks import check_layer, model_config
from kvstate.kv_manager.errors import ModeError
from kvstate.kv_manager.modes import BASIC, PAGED, check_mode, mode_capacity, mode_geometry
from kvstate.kv_manager.names import anchor_name, layer_name
from kvstate.kv_manager.prefix import find_prefix, prefix_tokens_of
from kvstate.kv_manager.stats import (
    active_request_ids,
    basic_efficiency,
    cached_tokens,
    paged_efficiency,
    used_pages,
)
from kvstate.kv_manager.values import ValueStore, default_dtype
from kvstate.kv_manager.vectors import kv_vectors
from kvstate.planner.builder import Plan
from kvstate.state import Geometry


class KVCacheManager:
    """Seed-002 KV-cache manager (basic reservation, paged attention, prefix caching).

    Values round-trip through ``dtype`` (default: float16 for ``dtype_bytes=2``),
    so ``get_kv`` returns each appended float rounded to that dtype: for
    float16 the relative error is at most 2**-11 for magnitudes in
    [6.1e-5, 65504] and the absolute error at most 2**-25 below.
    """

    def __init__(self, config: ModelConfig, max_gpu_memory_bytes: int, page_size: int = 16, *,
                 mode: str | None = None, dtype: torch.dtype | None = None,
                 device: str | torch.device | None = "cpu") -> None:
        self.config = model_config(config)
        self.max_gpu_memory_bytes = _count("max_gpu_memory_bytes", max_gpu_memory_bytes)
        if _count("page_size", page_size) == 0:
            raise ValueError("page_size must be positive")
        self.page_size = page_size
        self.bytes_per_token = self.config.bytes_per_token
        self.max_tokens = self.max_gpu_memory_bytes // self.bytes_per_token
        self.bytes_per_page = self.bytes_per_token // self.config.num_layers * page_size
        self.max_pages = self.max_gpu_memory_bytes // self.bytes_per_page
        self.dtype = dtype if dtype is not None else default_dtype(self.config.dtype_bytes)
        self.device = device
        self._mode: str | None = None
        self._prefix_cache = False
        self._store: ValueStore | None = None
        # A one-page placeholder until the mode (and so the geometry) is chosen.
        self.engine = Engine(Geometry(num_pages=1))
        checked_mode = check_mode(mode)
        if checked_mode is not None:
            self._enter(checked_mode)

    # -- mode and geometry ---------------------------------------------------
    @property
    def mode(self) -> str | None:
        """``'basic'``, ``'paged'``, or ``None`` until the first allocation."""
        return self._mode

    @property
    def prefix_cache_enabled(self) -> bool:
        return self._prefix_cache

    @property
    def _phantom(self) -> int:
        """1 when the budget holds no page: the geometry's lone page is never handed out."""
        mode = self._mode
        return 1 if mode is not None and mode_capacity(mode, self.max_tokens, self.max_pages) == 0 else 0

    def _enter(self, mode: str) -> None:
        if self._mode == mode:
            return
        if self._mode is not None:
            raise ModeError(f"this manager is in {self._mode} mode; "
                            f"{mode} calls need a separate KVCacheManager")
        geometry = mode_geometry(mode, self.max_tokens, self.max_pages, self.page_size)
        if geometry != self.engine.geometry:
            self.engine.configure(num_pages=geometry.num_pages, page_size=geometry.page_size,
                                  row_width=geometry.row_width)
        self._mode = mode

    # -- helpers -----------------------------------------------------------------
    def _commit(self, plan: Plan[Any]) -> Any:
        return self.engine.commit(plan)

    def _require(self, request_id: str) -> None:
        if not isinstance(request_id, str) or anchor_name(request_id) not in self.engine.state.requests:
            raise KeyError(f"unknown request {request_id!r}")

    def _layer(self, layer: int) -> int:
        return check_layer(layer, self.config.num_layers)

    def _values(self) -> ValueStore:
        if self._store is None:
            self._store = ValueStore(self.engine, self.config, paged=self._mode == PAGED,
                                     dtype=self.dtype, device=self.device)
        return self._store

    def _new_id(self, request_id: str) -> str:
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        return request_id

    # -- Part 1 ------------------------------------------------------------------------
    def allocate(self, request_id: str, prompt_tokens: int, max_gen_tokens: int) -> bool:
        """Reserve ``prompt_tokens + max_gen_tokens`` tokens (basic mode).

        False (nothing changed) if the id is active or the tokens do not fit.
        ``ValueError`` for negative sizes or a zero total.  Events:
        ``ReqAlloc(req/<id>, L0/<id>, ...)``, ``Allocate(pages, req/<id>)``.
        """
        self._new_id(request_id)
        total = _count("prompt_tokens", prompt_tokens) + _count("max_gen_tokens", max_gen_tokens)
        if total == 0:
            raise ValueError("a reservation needs prompt_tokens + max_gen_tokens > 0")
        self._enter(BASIC)
        if anchor_name(request_id) in self.engine.state.requests:
            return False
        plan = basic.plan_reserve(self.engine.state, request_id, self.config.num_layers, total,
                                  self._phantom)
        if plan is None:
            return False
        self._commit(plan)
        return True

    def append_token(self, request_id: str, layer: int, key: list[float], value: list[float]) -> None:
        """Store one token's K/V for one layer (basic mode; in paged mode = ``append_token_paged``).

        ``KeyError`` unknown request, ``ValueError`` bad layer or vector length,
        ``ReservationExceeded`` past the reservation.  Events: ``Share`` of the
        next reserved page into ``L<layer>/<id>``, ``Append``.
        """
        if self._mode == PAGED:
            self.append_token_paged(request_id, layer, key, value)
            return
        self._require(request_id)
        self._layer(layer)
        k, v = kv_vectors(self.config, key, value)
        plan = basic.plan_append(self.engine.state, request_id, layer)
        store = self._values()
        slot = self._commit(plan)
        store.write(layer, slot, k, v)

    def get_kv(self, request_id: str, layer: int) -> tuple[list[list[float]], list[list[float]]]:
        """``(keys, values)`` stored for one layer, in append order (read-only)."""
        self._require(request_id)
        self._layer(layer)
        state = self.engine.state
        table = layer_name(request_id, layer)
        slots = state.slots_of(table, 0, state.requests[table].committed)
        if not slots:
            return [], []
        if self._store is None:  # nothing was ever written: a reused prefix reads as zeros
            return ([[0.0] * (self.config.num_kv_heads * self.config.head_dim) for _ in slots],
                    [[0.0] * (self.config.num_kv_heads * self.config.value_head_dim)
                     for _ in slots])
        return self._store.read(layer, slots)

    def free(self, request_id: str) -> None:
        """Release a request (``KeyError`` if unknown).  Events: ``ReqFree``, ``Free``,
        and in paged mode ``Touch`` + ``Unlock`` of the prefix it used (which stays cached)."""
        self._require(request_id)
        names = self.config.num_layers
        if self._mode == BASIC:
            self._commit(basic.plan_release(self.engine.state, request_id, names))
        else:
            self._commit(paged.plan_close(self.engine.state, request_id, names))

    def stats(self) -> dict[str, int | float]:
        """The seed's five keys, derived from the core state (read-only)."""
        state = self.engine.state
        unit = self.bytes_per_token if self._mode == BASIC else self.bytes_per_page
        used = used_pages(state) * unit if self._mode is not None else 0
        total = self.max_gpu_memory_bytes
        return {
            "total_memory_bytes": total,
            "used_memory_bytes": used,
            "num_active_requests": len(active_request_ids(state)),
            "total_cached_tokens": cached_tokens(state),
            "utilization_pct": used / total * 100.0 if total else 0.0,
        }

    # -- Part 2 ---------------------------------------------------------------------
    def allocate_paged(self, request_id: str, prompt_tokens: int) -> bool:
        """Open a paged request with ``ceil(prompt_tokens / page_size)`` pages per layer.

        False (nothing changed) for an active id or too few pages after
        evicting unused prefixes.  Events: ``ReqAlloc``, [``Evict``], ``Allocate``.
        """
        self._new_id(request_id)
        prompt = _count("prompt_tokens", prompt_tokens)
        self._enter(PAGED)
        if anchor_name(request_id) in self.engine.state.requests:
            return False
        plan = paged.plan_open(self.engine.state, request_id, self.config.num_layers, prompt,
                               self._phantom)
        if plan is None:
            return False
        self._commit(plan)
        return True

    def append_token_paged(self, request_id: str, layer: int, key: list[float],
                           value: list[float]) -> None:
        """Store the next token of one layer, taking a page at a page boundary.

        Raises ``OutOfMemory`` (nothing changed) when no page is free even
        after evicting unused prefixes.  Copy-on-write for shared pages.
        """
        if self._mode == BASIC:
            raise ModeError("append_token_paged needs a paged request; this manager is in "
                            "basic mode (use append_token)")
        self._require(request_id)
        self._layer(layer)
        k, v = kv_vectors(self.config, key, value)
        plan = paged.plan_append(self.engine.state, request_id, layer, self._phantom)
        store = self._values()
        slot = self._commit(plan)
        store.write(layer, slot, k, v)

    def memory_efficiency(self) -> float:
        """Stored (token, layer) entries / allocated (token, layer) slots; 0.0 when empty."""
        state = self.engine.state
        if self._mode == BASIC:
            return basic_efficiency(state, self.config.num_layers)
        if self._mode == PAGED:
            return paged_efficiency(state, self.config.num_layers)
        return 0.0

    # -- Part 3 -----------------------------------------------------------------------
    def enable_prefix_cache(self) -> None:
        """Allow ``allocate_with_prefix`` (puts the manager in paged mode; idempotent)."""
        self._enter(PAGED)
        self._prefix_cache = True

    def allocate_with_prefix(self, request_id: str, prefix_hash: str, prefix_tokens: int,
                             unique_tokens: int) -> bool:
        """Open a request on a shared prefix (see ``sharing.py`` for the events).

        A seen ``prefix_hash`` is reused read-only through refcounts; a new one
        is registered.  False (nothing changed) for an active id or too few
        pages.  ``ValueError`` if the hash is retained with another length.
        """
        if not self._prefix_cache:
            raise ModeError("call enable_prefix_cache() before allocate_with_prefix()")
        self._new_id(request_id)
        if not isinstance(prefix_hash, str):
            raise TypeError(f"prefix_hash must be a str, got {type(prefix_hash).__name__}")
        prefix = _count("prefix_tokens", prefix_tokens)
        unique = _count("unique_tokens", unique_tokens)
        state = self.engine.state
        node_id = find_prefix(state, prefix_hash) if prefix else None
        if node_id is not None and prefix_tokens_of(state.nodes[node_id]) != prefix:
            raise ValueError(f"prefix {prefix_hash!r} is cached with "
                             f"{prefix_tokens_of(state.nodes[node_id])} tokens, not {prefix}")
        if anchor_name(request_id) in state.requests:
            return False
        if prefix == 0:
            return self.allocate_paged(request_id, unique)
        plan = sharing.plan_open_with_prefix(state, request_id, self.config.num_layers,
                                             prefix_hash, prefix, unique, node_id, self._phantom)
        if plan is None:
            return False
        registered = self._commit(plan)
        if registered and self._store is not None:
            new_node = find_prefix(self.engine.state, prefix_hash)
            assert new_node is not None
            self._store.zero_pages(self.engine.state.nodes[new_node].pages)
        return True
