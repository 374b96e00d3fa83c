"""SGLang's KV slot allocators on the kvstate core.

``TokenToKVPoolAllocator`` (page size 1): slots from 1, taken from the head
of the free list, frees appended at the tail in the order given (FIFO).
``PagedTokenToKVPoolAllocator``: whole pages from the head; one ``free``
call sorts its pages and puts them back at the head, ``free_segment`` and
``free_page_ids`` put them back in the order given.  Neither ever evicts:
``alloc*`` returns ``None`` when short, and nothing changes.

A free of pages a live request row still maps commits ``FreeMapped`` (see
``kvstate.sglang.frees``); other frees commit ``Free``.  Departures from
SGLang (docs/deviations.md): a duplicate or double free raises
``InvalidEvent`` instead of corrupting the free list, and ``restore_state``
keeps pages freed after the backup.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

import attrs
import torch

from kvstate.backends.persistent import apply
from kvstate.engine import Engine
from kvstate.events import Allocate, Event, Free, Reset
from kvstate.planner.alloc import decode_slots, extend_slots, new_pages_for_extend
from kvstate.sglang.binding import FrontEndMixin, engine_for_allocator
from kvstate.sglang.frees import Group, ParkedPages, end_free_group, free_events, refusal
from kvstate.sglang.inputs import (
    as_int,
    bind_forms,
    decode_args,
    extend_form,
    extend_form_0523,
    int64_tensor,
    int_list,
)
from kvstate.state import DETACHED, State

_INT32_SLOTS = 1 << 31  # req_to_token is int32: every slot id must fit


@attrs.frozen
class AllocatorBackup:
    """Opaque result of ``backup_state``: the state at that moment (O(1), shared), and the
    engine it was taken from (a backup restores only there)."""

    state: State
    engine: Engine = attrs.field(eq=False, repr=False)


class TokenToKVPoolAllocator(FrontEndMixin):
    page_size = 1

    def __init__(self, size: int, dtype: torch.dtype = torch.float16, device: str = "cpu",
                 kvcache: Any = None, need_sort: bool = False, *,
                 engine: Engine | None = None) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"size must be a positive int, got {size!r}")
        if need_sort:
            raise ValueError("need_sort (PD disaggregation's deferred, sorted frees) is not modelled")
        num_pages = size // self.page_size
        if (num_pages + 1) * self.page_size > _INT32_SLOTS:
            raise ValueError(f"{size} slots do not fit req_to_token's int32 entries")
        self.size = size
        self.dtype = dtype
        self.device = device
        self.engine = engine_for_allocator(num_pages, self.page_size, engine)
        # An open free group: slot lists for ``free`` and page-id lists for ``free_page_ids``.
        self._group: tuple[list[list[int]], list[list[int]]] | None = None
        self._parked = ParkedPages()  # the open group's pages, to refuse a bad free early
        self._kvcache = kvcache
        if kvcache is not None and hasattr(kvcache, "attach"):
            kvcache.attach(self.engine)

    def get_kvcache(self) -> Any:
        return self._kvcache

    def available_size(self) -> int:
        """Free slots; slots parked in an open free group are not counted (as in SGLang)."""
        return len(self.engine.view.free_pages) * self.page_size

    # -- allocation ---------------------------------------------------------------
    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots (whole pages) from the head, or ``None``.  Commits ``Allocate``."""
        need = as_int(need_size, "need_size")
        if need % self.page_size:
            raise ValueError(f"alloc({need}) is not a multiple of page size {self.page_size}")
        free_pages = self.engine.view.free_pages
        if need // self.page_size > len(free_pages):
            return None
        pages = free_pages.head(need // self.page_size)
        if pages:
            self._commit([Allocate(tuple(pages))])
        return self._slots_tensor(pages)

    # -- frees ----------------------------------------------------------------------
    def free(self, free_index: Any) -> None:
        """Free slots (a tensor, list or int).  Commits ``Free`` and/or ``FreeMapped``.

        Inside a free group the slots are parked until ``free_group_end``.
        """
        slots = int_list(free_index, "free_index")
        if not slots:
            return
        if self._group is not None:
            pages, at_head = self._free_order(slots)
            self._park_checked([("free", pages, at_head)])
            self._group[0].append(slots)
            return
        self._free([self._free_order(slots)])

    def free_segment(self, free_index: Any, *, start_pos: int) -> None:
        """Free ``row[start_pos : start_pos + n]`` of one request (``start_pos`` page-aligned).

        Commits ``Free`` / ``FreeMapped`` (parked inside a free group).
        """
        start = as_int(start_pos, "start_pos")
        if start % self.page_size:
            raise ValueError(f"segment start {start} is not page-aligned")
        self.free(free_index)

    def free_segments(self, segments: Sequence[tuple[Any, int]]) -> None:
        """Several ascending, page-disjoint ``(free_index, start_pos)`` segments of one row.

        One batch of ``Free`` / ``FreeMapped`` for all of them (all or nothing).
        """
        size = self.page_size
        groups: list[Group] = []
        previous_end: int | None = None
        for free_index, start_pos in segments:
            slots = int_list(free_index, "free_index")
            start = as_int(start_pos, "start_pos")
            if start % size:
                raise ValueError(f"segment start {start} is not page-aligned")
            if not slots:
                continue
            if previous_end is not None and start // size <= (previous_end - 1) // size:
                raise ValueError(f"segment at {start} shares a page with the one ending at "
                                 f"{previous_end}")
            previous_end = start + len(slots)
            groups.append(self._segment_order(slots))
        if self._group is not None:
            self._park(groups)
        elif groups:
            self._free(groups)

    def free_page_ids(self, page_ids: Any) -> None:
        """Free exactly these pages (page size 1: slot ids).  Commits ``Free`` / ``FreeMapped``."""
        self.free(page_ids)

    def free_group_begin(self) -> None:
        """Park every free until ``free_group_end`` (commits nothing)."""
        if self._group is not None:
            raise RuntimeError("free groups cannot be nested")
        self._group = ([], [])
        self._parked = ParkedPages()

    def free_group_end(self) -> None:
        """Free everything parked since ``free_group_begin``: one batch of ``Free`` /
        ``FreeMapped`` in SGLang's order (the ``free`` calls, then the page-id calls)."""
        if self._group is None:
            raise RuntimeError("free_group_end without free_group_begin")
        slot_lists, page_lists = parked = self._group

        def free_parked() -> None:
            groups: list[Group] = []
            if slot_lists:
                groups.append(self._free_order([s for slots in slot_lists for s in slots]))
            if page_lists:
                groups.append(([p for pages in page_lists for p in pages], True))
            if groups:
                self._free(groups)

        end_free_group(self, parked, free_parked)

    def clear(self) -> None:
        """Every page free again; needs an empty tree and no open row.  Commits ``Reset("pages")``
        (an open free group is dropped with it, and kept when the reset is refused)."""
        end_free_group(self, self._group, lambda: self._commit([Reset("pages")]))

    def backup_state(self) -> AllocatorBackup:
        return AllocatorBackup(self.engine.state, self.engine)

    def restore_state(self, backup: AllocatorBackup) -> None:
        """Give back pages allocated since ``backup`` and still unused, in their old order.

        Exact when nothing was freed in between; pages freed in between stay
        free.  Commits ``Free`` (at the head).
        """
        if not isinstance(backup, AllocatorBackup) or backup.engine is not self.engine:
            raise ValueError("restore_state takes a backup_state() of this allocator's engine")
        view = self.engine.view
        holders, current = view.holders, view.free_pages
        pages = [p for p in backup.state.free_pages
                 if p not in current and holders.get(p) == (DETACHED,)]
        if pages:
            self._commit([Free(tuple(pages), at_head=True)])

    # -- helpers ------------------------------------------------------------------------
    def _slots_tensor(self, pages: Sequence[int]) -> torch.Tensor:
        size = self.page_size
        return int64_tensor(pages if size == 1 else
                            [page * size + k for page in pages for k in range(size)])

    def _free_order(self, slots: list[int]) -> Group:
        """FIFO: the slots go to the tail in the order given (a duplicate is refused)."""
        return slots, False

    def _segment_order(self, slots: list[int]) -> Group:
        return self._free_order(slots)

    def _park(self, groups: list[Group]) -> None:
        """Park page-id frees (all checked before any is parked)."""
        assert self._group is not None
        self._park_checked([("ids", pages, at_head) for pages, at_head in groups])
        for pages, _ in groups:
            self._group[1].append(list(pages))

    def _park_checked(self, parts: list[tuple[str, Sequence[int], bool]]) -> None:
        """Refuse now what the group's end would refuse for these parts (a page freed twice
        in the group, or one that cannot be freed), then record their pages.  The end frees
        the ``free`` calls' pages (once each when paged) and the page-id calls' pages."""
        parked = self._parked
        checked = []
        for kind, pages, at_head in parts:
            rivals = ("ids",) if kind == "free" else ("free",)
            new = parked.new_pages(kind, rivals, pages,
                                   merged=kind == "free" and self.page_size > 1)
            groups = [(new, at_head)]
            if new and free_events(self.engine.view, groups) is None:
                self._refuse(groups)
            checked.append((kind, new))
        if len(parts) > 1:  # parts of one call must not repeat each other either
            pages_named = [page for _, new in checked for page in new]
            if len(set(pages_named)) != len(pages_named):
                raise ValueError("a page is freed twice in this free group")
        for kind, new in checked:
            parked.add(kind, new)

    def _free(self, groups: list[Group]) -> None:
        """Free every group in one batch; a page that cannot be freed changes nothing."""
        events = free_events(self.engine.view, groups)
        if events is None:
            self._refuse(groups)
        self._commit(events)

    def _refuse(self, groups: Sequence[Group]) -> NoReturn:
        """Raise the rules' refusal of a free the front end cannot plan: they name the bad
        page, on a frozen copy (an error path: the freeze is fine)."""
        apply(self.engine.state, refusal(groups))
        raise AssertionError("the rules accepted a free the front end could not plan")

    def _commit(self, events: list[Event]) -> None:
        self.engine.commit_events(events)


class PagedTokenToKVPoolAllocator(TokenToKVPoolAllocator):
    def __init__(self, size: int, page_size: int, dtype: torch.dtype = torch.float16,
                 device: str = "cpu", kvcache: Any = None, need_sort: bool = False, *,
                 engine: Engine | None = None) -> None:
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        self.page_size = page_size
        super().__init__(size, dtype, device, kvcache, need_sort, engine=engine)

    def _free_order(self, slots: list[int]) -> Group:
        """A free releases every page it touches, sorted, back at the head."""
        return sorted({slot // self.page_size for slot in slots}), True

    def _segment_order(self, slots: list[int]) -> Group:
        """A segment is whole pages from a page boundary: one slot per page, in row order."""
        return [slot // self.page_size for slot in slots[:: self.page_size]], True

    def free_segment(self, free_index: Any, *, start_pos: int) -> None:
        """A segment's pages, in row order, at the head.  Commits ``Free`` / ``FreeMapped``."""
        self.free_segments([(free_index, start_pos)])

    def free_page_ids(self, page_ids: Any) -> None:
        """Free exactly these pages, at the head in this order.  Commits ``Free`` / ``FreeMapped``."""
        pages = int_list(page_ids, "page_ids")
        if not pages:
            return
        if self._group is not None:
            self._park([(pages, True)])
        else:
            self._free([(pages, True)])

    def alloc_extend(self, *args: Any, **kwargs: Any) -> torch.Tensor | None:
        """SGLang's three-part extend: fill the old partial page, whole pages, a new partial page.

        Takes ``(prefix_lens, seq_lens, last_loc[, extend_num_tokens])`` or
        0.5.23's ``(prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu,
        last_loc, extend_num_tokens[, num_new_pages])``.  ``None`` (nothing
        changes) when the new pages do not fit.  Commits ``Allocate``.
        """
        bound = bind_forms("alloc_extend", args, kwargs, extend_form_0523, extend_form)
        prefixes = int_list(bound["prefix_lens"], "prefix_lens")
        seqs = int_list(bound["seq_lens"], "seq_lens")
        lasts = int_list(bound["last_loc"], "last_loc", low=-1,  # as alloc_decode bounds it
                         high=(self.engine.geometry.num_pages + 1) * self.page_size - 1)
        if not len(prefixes) == len(seqs) == len(lasts):
            raise ValueError("prefix_lens, seq_lens and last_loc must have one entry per request")
        size = self.page_size
        for prefix, seq, last in zip(prefixes, seqs, lasts, strict=True):
            if seq < prefix:
                raise ValueError(f"seq_len {seq} is shorter than its prefix_len {prefix}")
            if (last + 1) % size != prefix % size:
                raise ValueError(f"last_loc {last} does not sit at position {prefix - 1} of a page")
        extend = sum(seqs) - sum(prefixes)
        if bound["extend_num_tokens"] is not None and as_int(
                bound["extend_num_tokens"], "extend_num_tokens") != extend:
            raise ValueError(f"extend_num_tokens must be sum(seq_lens) - sum(prefix_lens) = {extend}")
        needed = sum(new_pages_for_extend(size, p, s) for p, s in zip(prefixes, seqs, strict=True))
        if bound.get("num_new_pages") is not None and as_int(
                bound["num_new_pages"], "num_new_pages") != needed:
            raise ValueError(f"num_new_pages must be {needed}")
        free_pages = self.engine.view.free_pages
        if needed > len(free_pages):
            return None
        pages = free_pages.head(needed)
        slots = extend_slots(size, list(zip(prefixes, seqs, lasts, strict=True)), pages)
        if pages:
            self._commit([Allocate(tuple(pages))])
        return int64_tensor([s for group in slots for s in group])

    def alloc_decode(self, *args: Any, **kwargs: Any) -> torch.Tensor | None:
        """One slot per request; ``seq_lens`` are the lengths *after* this token.

        Takes ``(seq_lens, last_loc)`` or 0.5.23's ``(seq_lens, seq_lens_cpu,
        last_loc)``.  ``None`` when short.  Commits ``Allocate``.
        """
        seqs, lasts = decode_args(args, kwargs, self.page_size,
                                  self.engine.geometry.num_pages)
        size = self.page_size
        needed = sum(1 for seq in seqs if (seq - 1) % size == 0)
        free_pages = self.engine.view.free_pages
        if needed > len(free_pages):
            return None
        pages = free_pages.head(needed)
        slots = decode_slots(size, [(seq - 1, last) for seq, last in zip(seqs, lasts, strict=True)],
                             pages)
        if pages:
            self._commit([Allocate(tuple(pages))])
        return int64_tensor(slots)


__all__ = ["AllocatorBackup", "PagedTokenToKVPoolAllocator", "TokenToKVPoolAllocator"]
