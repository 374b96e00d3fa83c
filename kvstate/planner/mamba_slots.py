"""Mamba slot allocation for requests (SGLang 0.5.23's ``MambaSlotAllocator`` callers).

* ``plan_take_slots``: slots from the head of the free list (``MambaAlloc``),
  or nothing when too few are free (``head_slots``: which, reading only);
* ``plan_slot_or_evict``: one slot, evicting one state first when none is
  free (``_alloc_mamba_slot``);
* ``plan_copy_on_match``: a hit's state copied into the request's own slot,
  allocated (under a temporary lock of the hit, evicting if needed) unless
  the request holds one (``finalize_match_result_in_cache``);
* ``plan_row_slots``: a new row's running slot and ping-pong track slots
  (``HybridReqToTokenPool.alloc``), then ``MambaBind``;
* ``plan_free_row_slots``: a finished request gives its slots back, all but
  the track slot kept in the tree (``free_mamba_cache``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.events import MambaAlloc, MambaBind, MambaCopy, MambaFree
from kvstate.planner.builder import Builder
from kvstate.planner.mamba_evict import plan_mamba_evict_for_alloc
from kvstate.planner.mamba_match import MambaMatch, plan_mamba_lock, plan_mamba_unlock
from kvstate.state import RequestId


def head_slots(state: Any, count: int) -> list[int] | None:
    """The ``count`` slots a ``MambaAlloc`` takes now (the free list's head), or ``None`` when
    fewer are free.  Reads only: a front end that commits this one event alone uses it."""
    queue = state.mamba.free_slots
    if count > len(queue):
        return None
    return [int(slot) for slot in queue.head(count)]


def plan_take_slots(b: Builder, count: int) -> list[int] | None:
    """``count`` slots off the head of the Mamba free list (``MambaAlloc``), or ``None``
    (nothing emitted) when fewer are free."""
    slots = head_slots(b.state, count)
    if slots:
        b.emit(MambaAlloc(tuple(slots)))
    return slots


def plan_slot_or_evict(b: Builder, *, at_head: bool) -> int:
    """One slot; when none is free, evict one state first (0: still none)."""
    slots = plan_take_slots(b, 1)
    if slots is None:
        plan_mamba_evict_for_alloc(b, 0, 0, 1, at_head=at_head)
        slots = plan_take_slots(b, 1)
    return slots[0] if slots else 0


def plan_copy_on_match(b: Builder, found: MambaMatch, held: int, *, at_head: bool,
                       window: int | None) -> int:
    """Copy the hit's state into the request's slot ``held`` (0: allocate one); the
    request's slot afterwards (0: none could be allocated).  No hit, no copy."""
    if not found.state:
        return held
    slot = held
    if not slot:
        slots = plan_take_slots(b, 1)
        if slots is None:  # make room with the hit pinned, so it cannot be the victim
            receipt = plan_mamba_lock(b, found.last_node, window=window)
            plan_mamba_evict_for_alloc(b, 0, 0, 1, at_head=at_head)
            slots = plan_take_slots(b, 1)
            plan_mamba_unlock(b, receipt)
            if slots is None:
                return 0
        slot = slots[0]
    b.emit(MambaCopy(found.state, slot))
    return slot


def plan_row_slots(b: Builder, row: RequestId, running: int, tracking: int) -> tuple[int, ...]:
    """Give row ``row`` its running slot (``running``, or a new one when 0) and
    ``tracking`` new track slots, and bind them (``MambaBind``).  The caller checked that
    enough slots are free."""
    if len(b.state.mamba.free_slots) < (0 if running else 1) + tracking:
        raise ValueError(f"row {row!r} needs more Mamba slots than are free")
    taken = _take(b, (0 if running else 1) + tracking)  # one MambaAlloc, in head order
    slots = (running, *taken) if running else tuple(taken)
    b.emit(MambaBind(row, slots))
    return slots


def _take(b: Builder, count: int) -> list[int]:
    taken = plan_take_slots(b, count)
    if taken is None:
        raise ValueError(f"{count} Mamba slots are not free")
    return taken


def plan_free_row_slots(b: Builder, row: RequestId, keep: int | None = None) -> None:
    """Free the row's running slot, then its track slots but entry ``keep`` (0-based among
    the track slots; that one went to the tree).  The free list gets them in that order:
    one ``MambaFree`` when the row gives back every slot, one per slot otherwise."""
    entries = b.state.mamba.rows.get(row)
    if entries is None:
        return
    if keep is None and all(entries):  # every slot, running first: one free, same order
        b.emit(MambaFree(tuple(int(slot) for slot in entries)))
        return
    if entries[0]:
        b.emit(MambaFree((int(entries[0]),)))
    track: Sequence[int] = entries[1:]
    positions = [p for p in range(len(track)) if p != keep and track[p]]
    if not positions:
        return
    if len(positions) == len(track):
        b.emit(MambaFree(tuple(int(slot) for slot in track)))
        return
    for position in positions:
        b.emit(MambaFree((int(track[position]),)))
