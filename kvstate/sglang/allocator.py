"""SGLang's KV slot allocators on the kvstate core.

``TokenToKVPoolAllocator`` (page size 1): slots from 1, taken from the head
of the free list, frees appended at the tail in the order given (FIFO).
``PagedTokenToKVPoolAllocator``: whole pages from the head; one ``free``
call sorts its pages and puts them back at the head.  Neither ever evicts:
``alloc*`` returns ``None`` when short, and nothing changes.

Departures from SGLang (all deliberate, listed in docs/deviations.md): a
duplicate or double free raises ``InvalidEvent`` instead of corrupting the
free list, and ``restore_state`` keeps pages freed after the backup.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import torch

from kvstate.engine import Engine
from kvstate.events import Allocate, Free, Reset, Truncate
from kvstate.planner.alloc import decode_slots, extend_slots, new_pages_for_extend
from kvstate.planner.builder import PlanBuilder
from kvstate.sglang.binding import FrontEndMixin, engine_for_allocator
from kvstate.state import DETACHED, State


def _as_list(values: Any) -> list[int]:
    if isinstance(values, torch.Tensor):
        return [int(v) for v in values.reshape(-1).tolist()]
    if isinstance(values, int):
        return [values]
    return [int(v) for v in values]


@attrs.frozen
class AllocatorBackup:
    """Opaque result of ``backup_state``: the state at that moment (O(1), shared)."""

    state: State


class TokenToKVPoolAllocator(FrontEndMixin):
    page_size = 1

    def __init__(self, size: int, dtype: torch.dtype = torch.float16, device: str = "cpu",
                 kvcache: Any = None, *, engine: Engine | None = None) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"size must be a positive int, got {size!r}")
        self.size = size
        self.dtype = dtype
        self.device = device
        self.engine = engine_for_allocator(size // self.page_size, self.page_size, engine)
        self._free_group: list[list[int]] | None = None
        self._kvcache = kvcache
        if kvcache is not None and hasattr(kvcache, "attach"):
            kvcache.attach(self.engine)

    def get_kvcache(self) -> Any:
        return self._kvcache

    def available_size(self) -> int:
        """Free slots; slots parked in an open free group are not counted (as in SGLang)."""
        return len(self.engine.state.free_pages) * self.page_size

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size % self.page_size:
            raise ValueError(f"alloc({need_size}) is not a multiple of page size {self.page_size}")
        num_pages = need_size // self.page_size
        if num_pages > len(self.engine.state.free_pages):
            return None
        pages = self.engine.state.free_pages.head(num_pages)
        if pages:
            self.engine.apply(Allocate(tuple(pages)))
        return self._slots_tensor(pages)

    def free(self, free_index: Any) -> None:
        slots = _as_list(free_index)
        if not slots:
            return
        if self._free_group is not None:
            self._free_group.append(slots)
            return
        self._free_slots(slots)

    def free_group_begin(self) -> None:
        if self._free_group is not None:
            raise RuntimeError("free groups cannot be nested")
        self._free_group = []

    def free_group_end(self) -> None:
        pending, self._free_group = self._free_group, None
        if pending:
            self._free_slots([slot for group in pending for slot in group])

    def clear(self) -> None:
        self._free_group = None
        self.engine.apply(Reset("pages"))

    def backup_state(self) -> AllocatorBackup:
        return AllocatorBackup(self.engine.state)

    def restore_state(self, backup: AllocatorBackup) -> None:
        """Give back pages allocated since ``backup`` and still unused, in their old order.

        Exact when nothing was freed in between; pages freed in between stay free.
        """
        holders = self.engine.state.holders
        current = self.engine.state.free_pages
        pages = [p for p in backup.state.free_pages
                 if p not in current and holders.get(p) == (DETACHED,)]
        if pages:
            self.engine.apply(Free(tuple(pages), at_head=True))

    # -- helpers ---------------------------------------------------------------
    def _slots_tensor(self, pages: Sequence[int]) -> torch.Tensor:
        size = self.page_size
        slots = [page * size + k for page in pages for k in range(size)]
        return torch.tensor(slots, dtype=torch.int64)

    def _free_order(self, slots: list[int]) -> tuple[list[int], bool]:
        """FIFO: pages appended at the tail in the order given (duplicates are rejected)."""
        return slots, False

    def _free_slots(self, slots: list[int]) -> None:
        """One atomic plan: release trailing row pages, then free; nothing changes on error."""
        pages, at_head = self._free_order(slots)
        builder = PlanBuilder(self.engine.state)
        _release_from_rows(builder, pages, self.page_size)
        builder.emit(Free(tuple(pages), at_head))
        self.engine.commit(builder.done(None))


def _release_from_rows(builder: PlanBuilder, pages: list[int], page_size: int) -> None:
    """Pages still mapped by a live row are released from it first (tail segments only).

    SGLang frees a request's KV before it frees the row; in the core a row
    must let go of a page before the page can be free, so freeing a row's
    trailing pages truncates that row.  A free from the middle of a row is
    left to the reducer, which refuses it and names the page.
    """
    state = builder.state
    by_request: dict[Any, list[int]] = {}
    for page in pages:
        held = state.holders.get(page, ())
        if len(held) == 1 and held != (DETACHED,):
            by_request.setdefault(held[0], []).append(page)
    for request_id, held_pages in by_request.items():
        table = list(state.requests[request_id].pages)
        first = min(table.index(p) for p in held_pages)
        rest = set(table[first:]) - set(held_pages)
        if any(p not in state.page_node for p in rest):
            continue
        builder.emit(Truncate(request_id, first * page_size))


class PagedTokenToKVPoolAllocator(TokenToKVPoolAllocator):
    def __init__(self, size: int, page_size: int, dtype: torch.dtype = torch.float16,
                 device: str = "cpu", kvcache: Any = None, *, engine: Engine | None = None) -> None:
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        self.page_size = page_size
        super().__init__(size, dtype, device, kvcache, engine=engine)

    def _free_order(self, slots: list[int]) -> tuple[list[int], bool]:
        """A free releases every page it touches, sorted, back at the head."""
        return sorted({slot // self.page_size for slot in slots}), True

    def alloc_extend(self, prefix_lens: Any, seq_lens: Any, last_loc: Any,
                     extend_num_tokens: int | None = None) -> torch.Tensor | None:
        """SGLang's three-part extend: fill the old partial page, whole pages, a new partial page."""
        prefixes, seqs, lasts = _as_list(prefix_lens), _as_list(seq_lens), _as_list(last_loc)
        if not len(prefixes) == len(seqs) == len(lasts):
            raise ValueError("prefix_lens, seq_lens and last_loc must have one entry per request")
        size = self.page_size
        for prefix, last in zip(prefixes, lasts, strict=True):
            if (last + 1) % size != prefix % size:
                raise ValueError(f"last_loc {last} does not sit at position {prefix - 1} of a page")
        needed = sum(new_pages_for_extend(size, p, s) for p, s in zip(prefixes, seqs, strict=True))
        if extend_num_tokens is not None and extend_num_tokens != sum(seqs) - sum(prefixes):
            raise ValueError("extend_num_tokens must equal sum(seq_lens) - sum(prefix_lens)")
        if needed > len(self.engine.state.free_pages):
            return None
        pages = self.engine.state.free_pages.head(needed)
        slots = extend_slots(size, list(zip(prefixes, seqs, lasts, strict=True)), pages)
        if pages:
            self.engine.apply(Allocate(tuple(pages)))
        return torch.tensor([s for group in slots for s in group], dtype=torch.int64)

    def alloc_decode(self, seq_lens: Any, last_loc: Any) -> torch.Tensor | None:
        """One slot per request; ``seq_lens`` are the lengths *after* this token."""
        seqs, lasts = _as_list(seq_lens), _as_list(last_loc)
        size = self.page_size
        entries = [(seq - 1, last) for seq, last in zip(seqs, lasts, strict=True)]
        needed = sum(1 for before, _ in entries if before % size == 0)
        if needed > len(self.engine.state.free_pages):
            return None
        pages = self.engine.state.free_pages.head(needed)
        slots = decode_slots(size, entries, pages)
        if pages:
            self.engine.apply(Allocate(tuple(pages)))
        return torch.tensor(slots, dtype=torch.int64)


__all__ = ["AllocatorBackup", "PagedTokenToKVPoolAllocator", "TokenToKVPoolAllocator"]
