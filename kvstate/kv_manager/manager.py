"""``KVCacheManager``: seed 002's public API on the event-sourced core.

Ownership: the manager owns an ``Engine`` (``.engine``, the one mutable
cell), its mode, the prefix-cache switch and a lazily built ``ValueStore``
(the torch executor holding the K/V values).  Every fact is core state,
changed only by the events the planner (``kvstate.planner.kv_manager``)
emits into one engine batch per call; the manager keeps no bookkeeping and
makes no decision of its own.  It checks arguments, converts the K/V
vectors and builds the value buffers before it opens the batch, and the
planner checks before it emits, so a call either commits all its events
(then writes its values, which cannot fail on a checked tensor) or raises /
returns ``False`` with the state and the stored values exactly as they were.
Modes: ``modes.py``; core request names: ``kvstate.planner.kv_layout``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

from kvstate.config import ModelConfig
from kvstate.engine import Engine
from kvstate.errors import ListenerError, OutOfMemory
from kvstate.kv_manager.checks import check_count, check_id, check_layer, check_new_id, check_text
from kvstate.kv_manager.checks import model_config as _model_config
from kvstate.kv_manager.errors import ModeError, ReservationExceeded
from kvstate.kv_manager.modes import BASIC, PAGED, check_capacity, check_mode, mode_capacity, mode_geometry
from kvstate.kv_manager.stats import basic_efficiency, paged_efficiency, seed_stats
from kvstate.kv_manager.values import ValueStore, storage_device, storage_dtype
from kvstate.kv_manager.vectors import kv_vectors
from kvstate.planner.kv_layout import anchor_name, find_prefix, layer_name, prefix_tokens_of
from kvstate.planner.kv_manager import (
    plan_basic_append,
    plan_basic_release,
    plan_open_with_prefix,
    plan_paged_append,
    plan_paged_close,
    plan_paged_open,
    plan_reserve,
)
from kvstate.state import Geometry, slots_of

R = TypeVar("R")


class KVCacheManager:
    """Seed-002 KV-cache manager (basic reservation, paged attention, prefix caching).

    Values are stored in ``dtype`` (default: float16 for ``dtype_bytes=2``), so
    ``get_kv`` returns them rounded to it (docs/kv-manager.md gives the bounds).
    """

    def __init__(self, config: ModelConfig, max_gpu_memory_bytes: int, page_size: int = 16, *,
                 mode: str | None = None, dtype: torch.dtype | None = None,
                 device: str | torch.device | None = "cpu") -> None:
        """Size the budget; commits no event and allocates no tensor (``TypeError``/``ValueError``)."""
        self.config = _model_config(config)
        self.max_gpu_memory_bytes = check_count("max_gpu_memory_bytes", max_gpu_memory_bytes)
        self.page_size = check_count("page_size", page_size)
        if self.page_size == 0:
            raise ValueError("page_size must be positive")
        self.bytes_per_token = self.config.bytes_per_token
        self.max_tokens = self.max_gpu_memory_bytes // self.bytes_per_token
        self.bytes_per_page = self.bytes_per_token // self.config.num_layers * self.page_size
        self.max_pages = self.max_gpu_memory_bytes // self.bytes_per_page
        check_capacity(self.max_tokens, self.max_pages)
        self.dtype = storage_dtype(dtype, self.config.dtype_bytes)
        self.device = storage_device(device)
        checked_mode = check_mode(mode)
        self._mode: str | None = None
        self._prefix_cache = False
        self._store: ValueStore | None = None
        # A one-page placeholder until the mode (and so the geometry) is chosen.
        self.engine = Engine(Geometry(num_pages=1))
        if checked_mode is not None:
            self._enter(checked_mode)

    # -- mode and geometry ---------------------------------------------------------------
    @property
    def mode(self) -> str | None:
        """``'basic'``, ``'paged'``, or ``None`` until the first allocation (no events)."""
        return self._mode

    @property
    def prefix_cache_enabled(self) -> bool:
        """Whether ``enable_prefix_cache`` was called (no events)."""
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

    # -- helpers ---------------------------------------------------------------------------
    def _require(self, request_id: object) -> str:
        """An active request's id (``TypeError`` for a non-str, ``KeyError`` if not active)."""
        text = check_id(request_id)
        if anchor_name(text) not in self.engine.view.requests:
            raise KeyError(f"unknown request {text!r}")
        return text

    def _values(self) -> ValueStore:
        """The value store, built (its buffers allocated) on first use, before any event."""
        if self._store is None:
            self._store = ValueStore(self.engine, self.config, paged=self._mode == PAGED,
                                     dtype=self.dtype, device=self.device)
        return self._store

    def _run(self, plan: Callable[..., R], *args: Any) -> tuple[R | None, ListenerError | None]:
        """One planner call in one engine batch: its result, and a listener's failure.

        A ``ListenerError`` comes after the batch was committed, so it is
        returned rather than raised: the caller first finishes the call's
        value writes (keeping the values in step with the committed events),
        then raises it.
        """
        result: R | None = None
        try:
            with self.engine.batch() as b:
                result = plan(b, *args)
        except ListenerError as failure:
            return result, failure
        return result, None

    def _append(self, request_id: str, layer: int, key: Any, value: Any) -> None:
        """Shared by both append calls: check, plan and commit, then write the values."""
        request_id = self._require(request_id)
        layer = check_layer(layer, self.config.num_layers)
        k, v = kv_vectors(self.config, key, value, self.dtype, self.device)
        store = self._values()
        if self._mode == PAGED:
            slot, failure = self._run(plan_paged_append, request_id, layer, self._phantom)
        else:
            slot, failure = self._run(plan_basic_append, request_id, layer)
        if slot is None:  # the planner emitted nothing
            if self._mode == PAGED:
                raise OutOfMemory(1, 0, "pages")
            reserved = self.engine.view.requests[anchor_name(request_id)].allocated
            raise ReservationExceeded(request_id, layer, reserved)
        # After the batch: the executor has moved a copy-on-write page's bytes by now.
        store.write(layer, slot, k, v)
        if failure is not None:
            raise failure

    # -- Part 1 ------------------------------------------------------------------------------
    def allocate(self, request_id: str, prompt_tokens: int, max_gen_tokens: int) -> bool:
        """Reserve ``prompt_tokens + max_gen_tokens`` tokens (basic mode).

        False (nothing changed) if the id is active or the tokens do not fit.
        ``TypeError``/``ValueError`` for a bad id or size, or a zero total.
        Commits ``ReqAlloc(req/<id>, L0/<id>, ...)``, ``Allocate(pages, req/<id>)``.
        """
        request_id = check_new_id(request_id, self.config.num_layers)
        total = check_count("prompt_tokens", prompt_tokens) + check_count("max_gen_tokens",
                                                                          max_gen_tokens)
        if total == 0:
            raise ValueError("a reservation needs prompt_tokens + max_gen_tokens > 0")
        self._enter(BASIC)
        with self.engine.batch() as b:
            return plan_reserve(b, request_id, self.config.num_layers, total, self._phantom)

    def append_token(self, request_id: str, layer: int, key: list[float], value: list[float]) -> None:
        """Store one token's K/V for one layer (in paged mode: ``append_token_paged``).

        ``KeyError`` unknown request, ``TypeError``/``ValueError`` bad layer or
        vector, ``ReservationExceeded`` past the reservation; each changes
        nothing.  Commits ``Share(L<layer>/<id>, pos, (page,))`` of the next
        reserved page and ``Append``, then writes the values.
        """
        if self._mode == PAGED:
            self.append_token_paged(request_id, layer, key, value)
            return
        self._append(request_id, layer, key, value)

    def get_kv(self, request_id: str, layer: int) -> tuple[list[list[float]], list[list[float]]]:
        """``(keys, values)`` stored for one layer, in append order.  Read-only: commits nothing."""
        request_id = self._require(request_id)
        layer = check_layer(layer, self.config.num_layers)
        view = self.engine.view
        table = layer_name(request_id, layer)
        slots = slots_of(view, table, 0, view.requests[table].committed)
        if not slots:
            return [], []
        if self._store is None:  # nothing was ever written: a reused prefix reads as zeros
            return ([[0.0] * (self.config.num_kv_heads * self.config.head_dim) for _ in slots],
                    [[0.0] * (self.config.num_kv_heads * self.config.value_head_dim)
                     for _ in slots])
        return self._store.read(layer, slots)

    def free(self, request_id: str) -> None:
        """Release a request (``KeyError`` if not active, nothing changed).

        Commits ``ReqFree(req/<id>, L0/<id>, ...)`` and ``Free`` of the pages no
        one else holds (at the head of the free list); in paged mode also
        ``Touch`` + ``Unlock`` of the prefix it used, which stays cached.
        """
        request_id = self._require(request_id)
        with self.engine.batch() as b:
            if self._mode == BASIC:
                plan_basic_release(b, request_id, self.config.num_layers)
            else:
                plan_paged_close(b, request_id, self.config.num_layers)

    def stats(self) -> dict[str, int | float]:
        """The seed's five keys, derived from the core state.  Read-only: commits nothing."""
        unit = self.bytes_per_token if self._mode == BASIC else self.bytes_per_page
        return seed_stats(self.engine.view, self._mode is not None, unit,
                          self.max_gpu_memory_bytes)

    # -- Part 2 --------------------------------------------------------------------------------
    def allocate_paged(self, request_id: str, prompt_tokens: int) -> bool:
        """Open a paged request with ``ceil(prompt_tokens / page_size)`` pages per layer.

        False (nothing changed, nothing evicted) for an active id or too few
        pages even after evicting unused prefixes.  Commits ``ReqAlloc``,
        [``Evict``], ``Allocate(pages, per-layer items)``.
        """
        request_id = check_new_id(request_id, self.config.num_layers)
        prompt = check_count("prompt_tokens", prompt_tokens)
        self._enter(PAGED)
        with self.engine.batch() as b:
            return plan_paged_open(b, request_id, self.config.num_layers, prompt, self._phantom)

    def append_token_paged(self, request_id: str, layer: int, key: list[float],
                           value: list[float]) -> None:
        """Store the next token of one layer, taking a page at a page boundary.

        Same argument errors as ``append_token``; ``OutOfMemory`` (nothing
        changed) when no page can be had even after evicting unused prefixes.
        Commits [``Evict``], [``Allocate`` | ``Allocate`` + ``Copy`` + ``Assign``
        (copy-on-write of a shared page)], ``Append``, then writes the values.
        """
        if self._mode == BASIC:
            raise ModeError("append_token_paged needs a paged request; this manager is in "
                            "basic mode (use append_token)")
        self._append(request_id, layer, key, value)

    def memory_efficiency(self) -> float:
        """Stored (token, layer) entries / allocated (token, layer) slots; 0.0 when empty.

        Read-only: commits nothing.
        """
        view, layers = self.engine.view, self.config.num_layers
        if self._mode is None:
            return 0.0
        return basic_efficiency(view, layers) if self._mode == BASIC else paged_efficiency(view, layers)

    # -- Part 3 ----------------------------------------------------------------------------------
    def enable_prefix_cache(self) -> None:
        """Allow ``allocate_with_prefix`` (puts the manager in paged mode; idempotent).

        Commits no event (``ModeError`` in basic mode).
        """
        self._enter(PAGED)
        self._prefix_cache = True

    def allocate_with_prefix(self, request_id: str, prefix_hash: str, prefix_tokens: int,
                             unique_tokens: int) -> bool:
        """Open a request on a shared prefix: reuse a retained ``prefix_hash``, else register it.

        False (nothing changed) for an active id or too few pages.
        ``ValueError`` if the hash is retained with another length; ``ModeError``
        before ``enable_prefix_cache``.  ``prefix_tokens == 0`` is
        ``allocate_paged``.  Commits, on reuse: ``ReqAlloc``, ``Touch``, ``Lock``,
        [``Evict``], ``Share`` (anchor and each layer), ``Append``, [``Allocate``];
        on registration: ``ReqAlloc``, [``Evict``], ``Allocate``, ``Insert``,
        ``Lock``, the ``Share``s, [``Allocate``].
        """
        if not self._prefix_cache:
            raise ModeError("call enable_prefix_cache() before allocate_with_prefix()")
        request_id = check_new_id(request_id, self.config.num_layers)
        prefix_hash = check_text("prefix_hash", prefix_hash)
        prefix = check_count("prefix_tokens", prefix_tokens)
        unique = check_count("unique_tokens", unique_tokens)
        view = self.engine.view
        node_id = find_prefix(view, prefix_hash) if prefix else None
        if node_id is not None and prefix_tokens_of(view.nodes[node_id]) != prefix:
            raise ValueError(f"prefix {prefix_hash!r} is cached with "
                             f"{prefix_tokens_of(view.nodes[node_id])} tokens, not {prefix}")
        if prefix == 0:
            return self.allocate_paged(request_id, unique)
        registered, failure = self._run(plan_open_with_prefix, request_id, self.config.num_layers,
                                        prefix_hash, prefix, unique, self._phantom)
        if registered is None:
            return False
        if registered and self._store is not None:  # freed pages may hold old values
            new_node = find_prefix(self.engine.view, prefix_hash)
            assert new_node is not None
            self._store.zero_pages(self.engine.view.nodes[new_node].pages)
        if failure is not None:
            raise failure
        return True
