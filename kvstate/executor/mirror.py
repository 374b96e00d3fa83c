"""Following an engine: ``Mirror``, the base of the executors, moves the bytes of its events.

``attach(engine)`` subscribes the executor to an
``Engine`` as a listener.  ``before(event, view)`` computes the event's index
plan from the state it applies to (:mod:`kvstate.executor.plan`), ``discard``
drops it if the rules refuse the event, and ``after(events, view)`` moves the
bytes of a committed batch in event order: ``Copy`` copies pages, frees
(``Free``, ``FreeMapped``, ``Evict``, ``Reset``, block releases) poison the
freed slots when ``poison_freed`` is set, ``Offload``/``Load`` copy to and
from the ``HostPool``.  Nothing moves for a batch the engine rolls back
(``rolled_back`` drops its plans).  The executor never decides anything.

Ownership: a ``Mirror`` owns nothing but the plans of the batch in flight;
its subclass owns the buffers (:mod:`kvstate.executor.buffers`,
:mod:`kvstate.executor.mla`), the engine owns the state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from kvstate.events import Event
from kvstate.executor.copies import PageViews, copy_pages_between, copy_slots_within, whole_pages
from kvstate.executor.index_plan import EMPTY_PLAN, IndexPlan
from kvstate.executor.plan import plan_indices
from kvstate.state import Geometry, State

POISON = float("nan")
PlanListener = Callable[[Event, IndexPlan], None]


class Mirror:
    """Follows an engine's events and moves the bytes; subclasses own the buffers.

    A subclass sets ``row_buffers`` (its ``[layers, rows, ...]`` tensors: K
    then V, or the one latent tensor) and ``page_views`` (per-page views of
    the tensors that hold them) in its constructor.  ``listeners`` are called
    with ``(event, plan)`` after each event's bytes moved, for every event
    whose plan is not ``EMPTY_PLAN`` (the integrity monitor is one).
    """

    geometry: Geometry
    device: torch.device
    poison_freed: bool
    listeners: list[PlanListener]
    row_buffers: tuple[torch.Tensor, ...]
    page_views: PageViews

    def _init_mirror(self, geometry: Geometry) -> None:
        self.geometry = geometry
        self.engine: Any = None
        self.listeners = []
        self.host_pool: Any = None
        self.integrity: Any = None
        self._pending: list[tuple[Event, IndexPlan]] = []

    # -- host tier -------------------------------------------------------------
    def enable_host(self, host_pool: Any) -> None:
        """Hold the host tier's bytes in ``host_pool`` (a ``HostPool``).

        Call it before ``attach`` to choose the pool (pinning); an engine with
        a host tier otherwise gets a default pool of its host pages on attach.
        """
        if self.engine is not None:
            self._check_host(self.engine.view, host_pool)
        self.host_pool = host_pool

    @staticmethod
    def _check_host(view: Any, host_pool: Any) -> None:
        tier = view.host
        if tier is not None and host_pool is not None and tier.num_pages != host_pool.num_pages:
            raise ValueError(f"host tier has {tier.num_pages} pages, the pool {host_pool.num_pages}")

    # -- following an engine ---------------------------------------------------
    def attach(self, engine: Any) -> None:
        """Follow ``engine`` from its current state on (the buffers are taken to match it)."""
        if self.engine is not None:
            raise RuntimeError("the executor already follows an engine")
        geometry = engine.geometry
        if (geometry.num_pages, geometry.page_size) != (self.geometry.num_pages,
                                                         self.geometry.page_size):
            raise ValueError(f"engine has {geometry.num_pages} pages of {geometry.page_size}; "
                             f"the executor was built for {self.geometry.num_pages} pages of "
                             f"{self.geometry.page_size}")
        view = engine.view
        self._check_host(view, self.host_pool)
        if view.host is not None and self.host_pool is None:
            from kvstate.executor.host import HostPool

            self.host_pool = HostPool(self, view.host.num_pages)
        self.geometry = geometry
        self.engine = engine
        self._pending.clear()
        engine.subscribe(self)

    def detach(self) -> None:
        """Stop following the engine (the buffers keep their bytes)."""
        if self.engine is not None:
            self.engine.unsubscribe(self)
            self.engine = None
            self._pending.clear()

    @property
    def view(self) -> Any:
        """The followed engine's current state, for reading (``engine.view``)."""
        if self.engine is None:
            raise RuntimeError("the executor follows no engine (call attach)")
        return self.engine.view

    @property
    def state(self) -> State:
        """The followed engine's current state, frozen (``engine.state``; not for hot paths)."""
        if self.engine is None:
            raise RuntimeError("the executor follows no engine (call attach)")
        return self.engine.state  # type: ignore[no-any-return]

    def before(self, event: Event, view: Any) -> None:
        """Engine listener: plan ``event`` against the state it applies to (nothing moves yet)."""
        self._pending.append((event, plan_indices(view, event)))

    def discard(self, event: Event) -> None:
        """Engine listener: the rules refused ``event``; forget its plan."""
        if self._pending and self._pending[-1][0] is event:
            self._pending.pop()

    def rolled_back(self, events: Sequence[Event]) -> None:
        """Engine listener: a failed batch was undone; its plans never move anything."""
        self._pending.clear()

    def after(self, events: Sequence[Event], view: Any) -> None:
        """Engine listener: move the bytes of a committed batch, in event order."""
        batch, self._pending = self._pending, []
        count = len(events)
        if len(batch) != count or (batch[0][0] is not events[0] if count == 1 else any(
                p[0] is not e for p, e in zip(batch, events, strict=True))):
            raise RuntimeError("the executor missed events of this batch (attached mid-batch?)")
        listeners = self.listeners
        for event, plan in batch:
            if plan is EMPTY_PLAN:
                continue  # moves nothing, changes no meaning: listeners need not hear of it
            self._move(plan)
            for listener in listeners:
                listener(event, plan)

    def _move(self, plan: IndexPlan) -> None:
        if plan.copy_src:
            self.copy_slots(plan.copy_src, plan.copy_dst)
        if plan.host_out_src or plan.host_in_src:
            if self.host_pool is None:
                raise RuntimeError("a host-tier event reached an executor without a HostPool")
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
        """Fill ``slots`` with NaN in every buffer and layer (debug aid for freed slots).

        Whole pages (what the plans hand over) are filled page-wise through the
        page views, one call per page tensor.
        """
        pages = whole_pages(slots, self.geometry.page_size)
        if pages is None:
            index = self._slot_index(slots)
            for tensor in self.row_buffers:
                tensor.index_fill_(1, index, POISON)
            return
        self.page_views.fill(pages, POISON)

    # -- reads in kernel layouts -----------------------------------------------------
    def gather_kv(self, state: Any, request: Any, layer: int,
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
