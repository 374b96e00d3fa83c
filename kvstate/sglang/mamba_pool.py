"""SGLang 0.5.23's ``HybridReqToTokenPool`` (request rows + a Mamba state pool) on the kvstate core.

``HybridReqToTokenPool`` is a ``ReqToTokenPool`` whose engine also has a
Mamba pool (``State.mamba``, ``mamba_size`` slots, slot 0 the dummy):

* ``mamba_allocator`` (``MambaSlotAllocator``): the free list, taken from the
  front and appended to on free (``MambaAlloc`` / ``MambaFree``);
* ``mamba_pool`` (``MambaPool``): the slots' states; ``copy_from`` records a
  state copy (``MambaCopy``);
* ``req_index_to_mamba_index_mapping`` (int32, one entry per row) and, with
  the extra buffer, ``req_index_to_mamba_ping_pong_track_buffer_mapping``
  (int64, ``[rows, track slots]``): real tensors that
  ``MambaMappingMirror`` keeps equal to the rows' Mamba slots as SGLang
  writes them (at ``alloc`` and on a donation; like SGLang, a freed row keeps
  its stale entries).

``alloc(reqs)`` gives each new request a row, its running slot (unless it
took one at match time) and its ping-pong track slots (2 with the overlap
scheduler, 1 without), in one batch (``ReqAlloc``, ``MambaAlloc``,
``MambaBind``).  Departures (docs/hybrid-mamba.md): request Mamba fields are
ints, not 0-d tensors; ``alloc`` refuses up front (``MemoryError``, nothing
changed) when the Mamba slots do not suffice, where 0.5.23 asserts after
taking the rows; lazy mode, speculative decoding, ReplaySSM and the int8
checkpoint pool are not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvstate.engine import Engine
from kvstate.events import Event, MambaAlloc, MambaBind, MambaCopy, MambaDonate, MambaFree, ReqAlloc, Reset
from kvstate.invariants import Violation
from kvstate.planner.mamba_slots import head_slots, plan_free_row_slots, plan_row_slots
from kvstate.sglang.binding import FrontEndMixin
from kvstate.sglang.inputs import as_int, cpu_array, int64_tensor, int_list
from kvstate.sglang.pool import ReqToTokenPool


def tracking_slots(*, extra_buffer: bool, overlap: bool) -> int:
    """Track slots a new request gets (SGLang's ``get_mamba_tracking_slots``, no lazy mode)."""
    return (2 if overlap else 1) if extra_buffer else 0


class MambaSlotAllocator(FrontEndMixin):
    """The Mamba free list, as SGLang's ``MambaSlotAllocator`` keeps it."""

    def __init__(self, engine: Engine, size: int) -> None:
        self.engine, self.size = engine, size

    @property
    def free_slots(self) -> torch.Tensor:
        return int64_tensor(list(self.engine.view.mamba.free_slots))

    def available_size(self) -> int:
        return len(self.engine.view.mamba.free_slots)

    def schedulable_available_size(self) -> int:
        return self.available_size()

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots from the front (held DETACHED), or ``None``.  Commits
        ``MambaAlloc``."""
        need = as_int(need_size, "need_size")
        slots = head_slots(self.engine.view, need)
        if slots:
            self.engine.commit_events((MambaAlloc(tuple(slots)),))
        return None if slots is None else int64_tensor(slots)

    def free(self, free_index: Any) -> None:
        """Append slots (held ones) to the free list, in order.  Commits ``MambaFree``."""
        slots = int_list(free_index, "free_index", low=1, high=self.size)
        if slots:
            self.engine.commit_events((MambaFree(tuple(slots)),))


class MambaPool:
    """The slots' states (kvstate keeps no tensors: a copy is a recorded fact)."""

    def __init__(self, engine: Engine, size: int) -> None:
        self.engine, self.size = engine, size

    def copy_from(self, src_index: Any, dst_index: Any) -> None:
        """Copy each source slot's state into the destination slot (held).  Commits
        ``MambaCopy``."""
        sources = int_list(src_index, "src_index", low=1, high=self.size)
        targets = int_list(dst_index, "dst_index", low=1, high=self.size)
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources and {len(targets)} destinations")
        with self.engine.batch() as batch:
            for src, dst in zip(sources, targets, strict=True):
                batch.emit(MambaCopy(src, dst))


_MAPPED = frozenset({MambaBind, MambaDonate, Reset})  # the events that write the mappings


class MambaMappingMirror:
    """Engine listener keeping the request -> Mamba slot tensors as SGLang writes them."""

    def __init__(self, running: torch.Tensor, track: torch.Tensor | None) -> None:
        self.running, self.track = running, track
        # where single entries are written: a CPU tensor's numpy view (same memory, cheaper)
        array = cpu_array(running)
        self._running = running if array is None else array
        self._track = None if track is None else cpu_array(track)

    def after(self, events: Sequence[Event], view: Any) -> None:
        for event in events:
            if type(event) not in _MAPPED:
                continue
            if isinstance(event, MambaBind) and type(event.row) is int:
                self._running[event.row] = event.slots[0]
                if self.track is not None and len(event.slots) > 1:
                    if self._track is not None:
                        self._track[event.row] = event.slots[1:]
                    else:
                        self.track[event.row] = int64_tensor(event.slots[1:])
            elif isinstance(event, MambaDonate) and self.track is not None:
                track = self.track if self._track is None else self._track
                track[int(event.row), event.index - 1] = event.fresh
            elif isinstance(event, Reset) and event.scope in ("rows", "all"):
                self.running.zero_()
                if self.track is not None:
                    self.track.zero_()

    def violations(self, view: Any) -> list[str]:
        problems = []
        for row, entries in view.mamba.rows.items():
            if type(row) is not int:
                continue
            if entries[0] and int(self.running[row]) != entries[0]:
                problems.append(f"row {row}: the mapping holds {int(self.running[row])}, the state "
                                f"slot {entries[0]}")
            if self.track is not None:
                for index, slot in enumerate(entries[1:]):
                    if slot and int(self.track[row, index]) != slot:
                        problems.append(f"row {row} track {index}: the mapping holds "
                                        f"{int(self.track[row, index])}, the state slot {slot}")
        return problems


class HybridReqToTokenPool(ReqToTokenPool):
    def __init__(self, *, size: int, mamba_size: int, max_context_len: int,
                 mamba_spec_state_size: int = 0, device: str = "cpu",
                 enable_memory_saver: bool = False, cache_params: Any = None,
                 mamba_layer_ids: Sequence[int] = (), enable_mamba_extra_buffer: bool = False,
                 enable_mamba_extra_buffer_lazy: bool = False,
                 speculative_num_draft_tokens: int | None = None,
                 enable_overlap_schedule: bool = True, engine: Engine | None = None) -> None:
        """0.5.23's keyword form; the model-shape arguments (``cache_params``,
        ``mamba_layer_ids``, ``mamba_spec_state_size``) are accepted and not used."""
        if isinstance(mamba_size, bool) or not isinstance(mamba_size, int) or mamba_size <= 0:
            raise ValueError(f"mamba_size must be a positive int, got {mamba_size!r}")
        if enable_mamba_extra_buffer_lazy or speculative_num_draft_tokens:
            raise ValueError("lazy extra buffers and speculative decoding are not modelled")
        super().__init__(size, max_context_len, device, enable_memory_saver, engine=engine)
        if self.engine.seq == 0:
            self.engine.configure(mamba_slots=mamba_size)
        elif self.engine.view.mamba is None or self.engine.view.mamba.num_slots != mamba_size:
            raise ValueError("the engine already holds no Mamba pool of this size")
        self.mamba_layer_ids, self.cache_params = list(mamba_layer_ids), cache_params
        self.enable_mamba_extra_buffer = bool(enable_mamba_extra_buffer)
        self.mamba_ping_pong_track_buffer_size = 2 if enable_overlap_schedule else 1
        self.mamba_initial_tracking_slots = tracking_slots(
            extra_buffer=self.enable_mamba_extra_buffer, overlap=enable_overlap_schedule)
        self.mamba_allocator = MambaSlotAllocator(self.engine, mamba_size)
        self.mamba_pool = MambaPool(self.engine, mamba_size)
        self.req_index_to_mamba_index_mapping = torch.zeros(size + 1, dtype=torch.int32,
                                                            device=device)
        self.req_index_to_mamba_ping_pong_track_buffer_mapping: torch.Tensor | None = None
        if self.enable_mamba_extra_buffer:
            self.req_index_to_mamba_ping_pong_track_buffer_mapping = torch.zeros(
                (size + 1, self.mamba_ping_pong_track_buffer_size), dtype=torch.int64,
                device=device)
        self._mapping = MambaMappingMirror(self.req_index_to_mamba_index_mapping,
                                           self.req_index_to_mamba_ping_pong_track_buffer_mapping)
        self.engine.subscribe(self._mapping)

    # -- rows ------------------------------------------------------------------------
    def alloc(self, need_size: Any) -> list[int] | None:  # type: ignore[override]
        """0.5.23's ``alloc(reqs)``: a row per new request, its running slot unless it holds
        one, its track slots.  ``None`` when rows are short; ``MemoryError`` (nothing
        changed) when Mamba slots are.  An int keeps the row-only form."""
        if not isinstance(need_size, (list, tuple)):
            return super().alloc(need_size)
        reqs = list(need_size)
        for req in reqs:
            kv = getattr(req, "kv", None)
            if not all(hasattr(kv, name) for name in ("req_pool_idx", "mamba_pool_idx",
                                                        "mamba_ping_pong_track_buffer")):
                raise TypeError(f"alloc takes requests with Mamba KV records, got {req!r}")
        if len({id(req) for req in reqs}) != len(reqs):
            raise ValueError("a request is named twice in one alloc")
        fresh = [req for req in reqs if req.kv.req_pool_idx is None]
        # The running slot each new request brings (0: none), checked: it goes into events.
        brought = [0 if req.kv.mamba_pool_idx is None else
                   as_int(req.kv.mamba_pool_idx, "mamba_pool_idx", low=1) for req in fresh]
        for req in reqs:
            if req.kv.req_pool_idx is not None and req.kv.req_pool_idx not in \
                    self.engine.view.mamba.rows:
                raise ValueError(f"{req!r} keeps a row without Mamba slots")
        needed = sum((req.kv.mamba_pool_idx is None) + self._track_need(req) for req in fresh)
        view = self.engine.view
        if len(fresh) > len(view.free_rows):
            return None
        if needed > len(view.mamba.free_slots):
            raise MemoryError(f"{needed} Mamba slots needed, {len(view.mamba.free_slots)} free")
        rows = view.free_rows.head(len(fresh))[::-1]
        with self.engine.batch() as batch:
            if rows:
                batch.emit(ReqAlloc(tuple(rows)))
            granted = [plan_row_slots(batch, row, slot, self._track_need(req))
                       for row, req, slot in zip(rows, fresh, brought, strict=True)]
            # The requests take their rows and slots inside the batch: a listener failing at
            # the commit raises after the events are applied.
            for row, req, slots in zip(rows, fresh, granted, strict=True):
                req.kv.req_pool_idx, req.kv.mamba_pool_idx = row, slots[0]
                if self.enable_mamba_extra_buffer:
                    size = self.mamba_ping_pong_track_buffer_size
                    req.kv.mamba_ping_pong_track_buffer = list(slots[1:])
                    req.kv.mamba_ping_pong_empty = [False] * size
                    req.kv.mamba_next_track_idx = 0
                    req.kv.mamba_last_track_idx = self.get_mamba_ping_pong_other_idx(0)
                    req.kv.mamba_prev_track_seqlen = None
        return [req.kv.req_pool_idx for req in reqs]

    def _track_need(self, req: Any) -> int:
        return self.mamba_initial_tracking_slots if req.kv.mamba_ping_pong_track_buffer is None \
            else 0

    def get_mamba_indices(self, req_indices: torch.Tensor) -> torch.Tensor:
        return self.req_index_to_mamba_index_mapping[req_indices]

    def get_mamba_ping_pong_other_idx(self, mamba_next_track_idx: int) -> int:
        return 1 - mamba_next_track_idx if self.mamba_ping_pong_track_buffer_size == 2 \
            else mamba_next_track_idx

    def get_mamba_ping_pong_keep_idx(self, req: Any) -> int:
        return int(req.kv.mamba_last_track_idx)

    def copy_mamba_state(self, src_index: Any, dst_index: Any) -> None:
        self.mamba_pool.copy_from(src_index, dst_index)

    def donate_mamba_ping_pong_slot(self, req: Any, new_slot: Any) -> torch.Tensor:
        """The request's latest track slot leaves for the tree (DETACHED); ``new_slot``
        takes its place.  Commits ``MambaDonate``; returns the donated slot (shape [1])."""
        row = as_int(req.kv.req_pool_idx, "req_pool_idx")
        fresh = as_int(int_list(new_slot, "new_slot")[0], "new_slot")
        index = self.get_mamba_ping_pong_keep_idx(req)
        entries = self.engine.view.mamba.rows.get(row, ())
        if not 0 <= index < len(entries) - 1:
            raise ValueError(f"{req!r} has no track entry {index}")
        donated = entries[1 + index]
        with self.engine.batch() as batch:
            batch.emit(MambaDonate(row, 1 + index, fresh))
            req.kv.mamba_ping_pong_track_buffer[index] = fresh  # inside the batch: see ``alloc``
        return int64_tensor([donated])

    def free_mamba_cache(self, req: Any, mamba_ping_pong_track_buffer_to_keep: int | None = None
                         ) -> None:
        """Free the request's running slot and its track slots but the kept one.  Commits
        ``MambaFree``."""
        kv = req.kv
        if kv.mamba_pool_idx is None:
            raise ValueError(f"{req!r} holds no Mamba slot (double free?)")
        keep = mamba_ping_pong_track_buffer_to_keep
        if keep not in (None, 0, 1) or (keep == 1 and self.mamba_ping_pong_track_buffer_size != 2):
            raise ValueError(f"cannot keep track entry {keep}")
        row = kv.req_pool_idx
        with self.engine.batch() as batch:
            if row is not None and row in batch.state.mamba.rows:
                plan_free_row_slots(batch, row, keep)
            else:
                batch.emit(MambaFree((int(kv.mamba_pool_idx),)))
            clear_mamba_fields(kv)  # inside the batch: see ``alloc``

    def verify(self) -> list[Violation]:
        """``req_to_token`` and both Mamba mappings against the state."""
        found = super().verify()
        return found + [Violation("req_index_to_mamba_index_mapping", message)
                        for message in self._mapping.violations(self.engine.view)]


def clear_mamba_fields(kv: Any) -> None:
    """A request's Mamba fields once its slots are gone (as SGLang's ``free_mamba_cache``)."""
    kv.mamba_pool_idx = None
    kv.mamba_ping_pong_track_buffer = None
    kv.mamba_ping_pong_empty = None
    kv.mamba_next_track_idx = None
    kv.mamba_last_track_idx = None
    kv.mamba_last_track_seqlen = None
    kv.mamba_prev_track_seqlen = None
    kv.mamba_cow_src_index = None


__all__ = ["HybridReqToTokenPool", "MambaMappingMirror", "MambaPool", "MambaSlotAllocator",
           "clear_mamba_fields", "tracking_slots"]
