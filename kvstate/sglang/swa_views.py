"""Read-only views of the SWA allocator: its two sub-allocators and the full -> SWA mapping.

``PoolView`` shows one pool's free list as SGLang's sub-allocators keep it;
``MappingMirror`` keeps the real ``full_to_swa_index_mapping`` tensor equal
to the state's pairing (``State.swa.peer``), slot by slot as SGLang writes
it: the listener clears the pages whose SWA was freed, then maps the slots
the allocator handed out, after every committed batch.  Neither changes the
state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvstate.events import Event, Reset, SwaEvict, SwaFree, SwaRebind
from kvstate.sglang.inputs import cpu_array, int64_tensor

_UNPAIRING = frozenset({SwaFree, SwaRebind, SwaEvict, Reset})  # events that unpair FULL pages


class PoolView:
    """Read-only view of one side (``full_attn_allocator`` / ``swa_attn_allocator``)."""

    def __init__(self, owner: Any, side: str, size: int) -> None:
        self._owner, self._side, self.size = owner, side, size
        self.page_size = owner.page_size
        self.release_pages = torch.empty((0,), dtype=torch.int64)

    def _queue(self) -> Any:
        view = self._owner.engine.view
        return view.free_pages if self._side == "full" else view.swa.free_pages

    @property
    def free_pages(self) -> torch.Tensor:
        """Free slots (page size 1) or free page ids (paged), head first, as SGLang keeps them."""
        return int64_tensor(list(self._queue()))

    def available_size(self) -> int:
        return len(self._queue()) * self.page_size


class MappingMirror:
    """Engine listener keeping ``full_to_swa_index_mapping`` equal to the pairing, slot by
    slot as SGLang writes it: a slot reads its SWA peer from when the allocator hands it
    out (``hand_out_at_commit``) until its page's SWA is freed (the whole page is cleared
    then, at the end of the batch: a page paired again in the same batch is mapped afresh
    by the batch's hand-outs, which follow the clearing)."""

    def __init__(self, tensor: torch.Tensor, page_size: int) -> None:
        self.tensor, self.page_size = tensor, page_size
        self._array = cpu_array(tensor)  # the same memory, for cheap writes on the CPU
        self._cleared: list[tuple[Event, list[int] | None]] = []  # None: after a reset
        self._handed: list[int] = []  # slots handed out in the open batch

    def hand_out(self, slots: Sequence[int], view: Any) -> None:
        """The allocator gave out FULL ``slots`` (just paired): map each to its SWA slot
        (through the numpy view on the CPU, one indexed write on another device)."""
        if not slots:
            return
        size, peer, tensor = self.page_size, view.swa.peer, self.tensor
        values = [peer[slot // size] * size + slot % size for slot in slots]
        array = self._array
        if array is not None:
            if len(slots) == 1:
                array[slots[0]] = values[0]
            else:
                array[list(slots)] = values
            return
        device = tensor.device
        tensor[int64_tensor(slots).to(device)] = int64_tensor(values).to(device)

    def hand_out_at_commit(self, batch: Any, slots: Sequence[int]) -> None:
        """``hand_out`` for slots the decision in the open ``batch`` gave out, done in this
        listener's ``after`` (so a listener failing at the commit cannot skip it); a batch
        without events commits nothing, so they are mapped now."""
        if batch.events:
            self._handed.extend(slots)
        else:
            self.hand_out(slots, batch.state)

    before_events = _UNPAIRING  # the engine calls ``before`` for these alone

    def before(self, event: Event, view: Any) -> None:
        pages: list[int] | None
        if isinstance(event, (SwaFree, SwaRebind)):
            pages = list(event.pages)
        elif isinstance(event, SwaEvict):
            nodes = view.nodes
            pages = [p for n in event.nodes if n in nodes for p in nodes[n].pages]
        else:
            pages = None
        self._cleared.append((event, pages))

    def discard(self, event: Event) -> None:
        self._cleared = [entry for entry in self._cleared if entry[0] is not event]

    def rolled_back(self, events: Sequence[Event]) -> None:
        """The open batch was undone: nothing it prepared or handed out may reach the tensor."""
        self._cleared, self._handed = [], []

    def after(self, events: Sequence[Event], view: Any) -> None:
        if not self._cleared and not self._handed:
            return  # most batches unpair and hand out nothing (a ``SwaRebind`` unpairs too)
        cleared, self._cleared = self._cleared, []
        handed, self._handed = self._handed, []
        size, peer = self.page_size, view.swa.peer
        gone: list[int] = []
        for _, pages in cleared:
            if pages is not None:  # unpaired by the event, even if paired again since
                gone.extend(pages)
            else:
                gone.extend(p for p in range((len(self.tensor) - 1) // size) if p not in peer)
        tensor, array = self.tensor, self._array
        if array is not None:
            for page in gone:
                array[page * size: page * size + size] = 0
        elif gone:
            index = int64_tensor([p * size + k for p in gone for k in range(size)])
            tensor.index_fill_(0, index.to(tensor.device), 0)
        for event in events:
            if type(event) is SwaRebind:  # the kept FULL slots read the moved SWA slots
                node = view.nodes.get(event.node)
                if node is not None:
                    self.hand_out([p * size + k for p in node.pages for k in range(size)], view)
        self.hand_out(handed, view)

    def violations(self, view: Any) -> list[str]:
        """Slots whose entry disagrees with the pairing (a write that bypassed the events)."""
        size, peer = self.page_size, view.swa.peer
        found = []
        entries = self.tensor.tolist()
        if entries[-1] != -1:
            found.append("the trailing entry is not -1")
        for slot, entry in enumerate(entries[:-1]):
            page, offset = divmod(slot, size)
            partner = peer.get(page)
            if entry and (partner is None or entry != partner * size + offset):
                found.append(f"slot {slot} maps to SWA slot {entry}, the state pairs page {page} "
                             f"with {partner}")
        return found

    def rebuild(self, view: Any) -> None:
        """Every paired page mapped in full (a fresh allocator over an existing state)."""
        self.tensor[:-1] = 0
        size = self.page_size
        self.hand_out([p * size + k for p in view.swa.peer for k in range(size)], view)


__all__ = ["MappingMirror", "PoolView"]
