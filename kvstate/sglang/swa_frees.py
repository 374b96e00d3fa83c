"""The frees of SGLang 0.5.23's ``SWATokenToKVPoolAllocator`` (a mixin over its engine).

SWA goes first (it reads the pairing), then FULL, in one batch per call.
Where the pages go is where SGLang's sub-allocators put them: page size 1 at
the tail in the order given; paged ``free`` sorted at the head, segments and
page ids at the head in row order.  SWA frees name FULL pages (``SwaFree``
frees their peers); FULL frees are ``Free`` for bare allocations and
``FreeMapped`` under a live row (``kvstate.sglang.frees``).  Inside a free
group every call is parked and released at ``free_group_end`` in 0.5.23's
group order: SWA page ids, SWA set frees, the FULL ``free`` calls, the FULL
page ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.engine import Engine
from kvstate.events import Event, Reset, SwaFree
from kvstate.sglang.frees import Group, ParkedPages, end_free_group, free_events
from kvstate.sglang.inputs import as_int, int_list


class SwaFreesMixin:
    """Frees over ``self.engine``; the allocator provides the attributes below."""

    engine: Engine
    page_size: int
    _group: dict[str, list[list[int]]] | None
    _parked: ParkedPages

    # -- frees --------------------------------------------------------------------------
    def free(self, free_index: Any) -> None:
        """Free slots on both pools (SWA first).  Commits ``SwaFree`` and ``Free`` /
        ``FreeMapped`` in one batch (parked inside a free group)."""
        slots = int_list(free_index, "free_index")
        self._run([self._swa_part(slots), ("full", slots)])

    def free_swa(self, free_index: Any) -> None:
        """Release the SWA peers of FULL slots (page size 1: every slot must have one;
        paged: the touched pages' peers, sorted, at the head).  Commits ``SwaFree``."""
        self._run([self._swa_part(int_list(free_index, "free_index"))])

    def free_swa_segment(self, free_index: Any, *, start_pos: int) -> None:
        """SWA peers of a row segment, page by page in row order.  Commits ``SwaFree``."""
        self._segment_start(start_pos)
        self._run([self._swa_ids(int_list(free_index, "free_index"))])

    def free_full(self, free_index: Any) -> None:
        """FULL slots whose SWA peers are gone.  Commits ``Free`` / ``FreeMapped``."""
        self._run([("full", int_list(free_index, "free_index"))])

    def free_full_segment(self, free_index: Any, *, start_pos: int) -> None:
        self.free_full_segments([(free_index, start_pos)])

    def free_segment(self, free_index: Any, *, start_pos: int) -> None:
        """A row segment on both pools: its SWA peers, then its FULL pages (one batch)."""
        self.free_segments([(free_index, start_pos)])

    def free_segments(self, segments: Sequence[tuple[Any, int]]) -> None:
        """Ascending row segments, each SWA first then FULL (one batch)."""
        parts = []
        for free_index, start_pos in segments:
            self._segment_start(start_pos)
            slots = int_list(free_index, "free_index")
            parts += [self._swa_ids(slots), self._full_segment(slots)]
        self._run(parts)

    def free_full_segments(self, segments: Sequence[tuple[Any, int]]) -> None:
        parts = []
        for free_index, start_pos in segments:
            self._segment_start(start_pos)
            parts.append(self._full_segment(int_list(free_index, "free_index")))
        self._run(parts)

    def free_group_begin(self) -> None:
        if self._group is not None:
            raise RuntimeError("free groups cannot be nested")
        self._group = {"swa_ids": [], "swa_set": [], "full": [], "full_ids": []}
        self._parked = ParkedPages()

    def free_group_end(self) -> None:
        """Release what the group parked: SWA page ids, SWA set frees, then the FULL group
        (its ``free`` calls, then its page ids), in one batch."""
        if self._group is None:
            raise RuntimeError("free_group_end without free_group_begin")
        group = self._group

        def free_parked() -> None:
            events: list[Event] = []
            for kind in ("swa_ids", "swa_set", "full", "full_ids"):
                items = [item for chunk in group[kind] for item in chunk]
                if items:
                    events.extend(self._events(kind, items))
            if events:
                self._commit(events)

        end_free_group(self, group, free_parked)

    def clear(self) -> None:
        """Every page of both pools free again (needs an empty tree and no open row).
        Commits ``Reset("pages")``; an open free group is dropped with it, and kept when the
        reset is refused."""
        end_free_group(self, self._group, lambda: self._commit([Reset("pages")]))

    def _park_checked(self, parts: list[tuple[str, list[int]]]) -> None:
        """Refuse now what the group's end would refuse for these parts: a FULL page (or an
        SWA peer) freed twice in the group, or a FULL page that cannot be freed.  The end
        frees each kind's parts together: paged ``free`` calls and SWA sets once per page."""
        parked, paged, size = self._parked, self.page_size > 1, self.page_size
        checked = []
        for kind, items in parts:
            pages = sorted({slot // size for slot in items}) if kind == "full" and paged \
                else items
            rivals = {"swa_ids": ("swa_set",), "swa_set": ("swa_ids",), "full": ("full_ids",),
                      "full_ids": ("full",)}[kind]
            new = parked.new_pages(kind, rivals, pages,
                                   merged=paged and kind in ("full", "swa_set"))
            if kind in ("full", "full_ids") and new and free_events(
                    self.engine.view, [(new, paged or kind == "full_ids")]) is None:
                raise ValueError(f"FULL pages {new[:8]} are not all freeable (free, in the tree, "
                                 "shared or named twice)")
            checked.append((kind, new))
        for kind, new in checked:
            parked.add(kind, new)

    # -- free helpers ---------------------------------------------------------------------
    def _segment_start(self, start_pos: int) -> None:
        if as_int(start_pos, "start_pos") % self.page_size:
            raise ValueError(f"segment start {start_pos} is not page-aligned")

    def _swa_part(self, slots: list[int]) -> tuple[str, list[int]]:
        if self.page_size == 1:
            return self._swa_ids(slots)
        peer = self.engine.view.swa.peer
        pages = {slot // self.page_size for slot in slots}
        return "swa_set", sorted((p for p in pages if p in peer), key=peer.__getitem__)

    def _swa_ids(self, slots: list[int]) -> tuple[str, list[int]]:
        """A segment's SWA part: the peer of each page, in row order (all must have one)."""
        pages = [slot // self.page_size for slot in slots[:: self.page_size]]
        peer = self.engine.view.swa.peer
        missing = [page for page in pages if page not in peer]
        if missing:
            raise ValueError(f"FULL page {missing[0]} has no SWA slot to free (use free_full)")
        return "swa_ids", pages

    def _full_segment(self, slots: list[int]) -> tuple[str, list[int]]:
        if self.page_size == 1:
            return "full", slots
        return "full_ids", [slot // self.page_size for slot in slots[:: self.page_size]]

    def _run(self, parts: list[tuple[str, list[int]]]) -> None:
        """Park the parts inside a free group, or commit them now in one batch."""
        parts = [(kind, items) for kind, items in parts if items]
        if self._group is not None:
            self._park_checked(parts)
            for kind, items in parts:
                self._group[kind].append(items)
            return
        events: list[Event] = []
        for kind, items in parts:
            events.extend(self._events(kind, items))
        if events:
            self._commit(events)

    def _events(self, kind: str, items: list[int]) -> list[Event]:
        """The events of one sub-allocator call: SWA frees name FULL pages by their peers."""
        paged = self.page_size > 1
        if kind == "swa_ids":
            return [SwaFree(tuple(items), paged)]
        if kind == "swa_set":
            if paged:
                peer = self.engine.view.swa.peer
                return [SwaFree(tuple(sorted(dict.fromkeys(items), key=peer.__getitem__)), True)]
            return [SwaFree(tuple(items), False)]
        groups: list[Group]
        if kind == "full" and paged:
            groups = [(sorted({slot // self.page_size for slot in items}), True)]
        else:
            groups = [(items, kind == "full_ids")]
        events = free_events(self.engine.view, groups)
        if events is None:
            raise ValueError(f"FULL pages {items[:8]} are not all freeable (free, in the tree, "
                             "shared or named twice)")
        return list(events)

    def _commit(self, events: list[Event]) -> None:
        self.engine.commit_events(events)


__all__ = ["SwaFreesMixin"]
