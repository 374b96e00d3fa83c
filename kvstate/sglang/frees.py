"""Turning an allocator ``free`` into events: ``Free``, or ``FreeMapped`` under a live row.

SGLang 0.5.23 frees slots that a request's row still maps: the duplicate
part after an insert (``checkpoint`` frees ``row[protected:prefix_len]``
before it rewrites the row) and the unaligned tail on finish (before the row
is freed).  A page that one open request holds alone, outside the tree, is
therefore freed with ``FreeMapped``: its row entries become *dangling* until
the row is rewritten there, truncated or closed.  Pages handed out by a bare
``alloc`` and never written (DETACHED) are freed with ``Free``.  Anything
else (a free page, a tree page, a page two requests share, a page twice) is
not freeable; the caller then tries one plain ``Free`` of every page on a
frozen copy of the state, so that the rule refuses it with the exact reason
and nothing changes.

Order: one call may mix both kinds.  The pages go back in the order SGLang
puts them back (the tail in the order given, or the head as one block), so
the events are runs of one kind, emitted in reverse for the head.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvstate.errors import ListenerError
from kvstate.events import Event, Free, FreeMapped
from kvstate.state import DETACHED

_DETACHED = (DETACHED,)

Group = tuple[Sequence[int], bool]  # (pages, at_head)


def free_events(view: Any, groups: Sequence[Group]) -> list[Event] | None:
    """The events freeing every group in turn, or ``None`` if a page is not freeable."""
    holders, page_node, requests = view.holders, view.page_node, view.requests
    seen: set[int] = set()
    out: list[Event] = []
    for pages, at_head in groups:
        runs: list[tuple[bool, list[int]]] = []
        for page in pages:
            if page in seen:
                return None
            seen.add(page)
            held = holders.get(page)
            if held == _DETACHED:
                mapped = False
            elif (held is not None and len(held) == 1 and page not in page_node
                  and held[0] in requests):
                mapped = True
            else:
                return None
            if runs and runs[-1][0] == mapped:
                runs[-1][1].append(page)
            else:
                runs.append((mapped, [page]))
        if at_head:
            runs.reverse()  # each run is pushed on the head: the first run must go last
        out.extend(FreeMapped(tuple(run), at_head) if mapped else Free(tuple(run), at_head)
                   for mapped, run in runs)
    return out


def refusal(groups: Sequence[Group]) -> Free:
    """One plain ``Free`` of every page: what the rules refuse with the reason of the first bad page."""
    pages = tuple(page for group, _ in groups for page in group)
    return Free(pages, bool(groups and groups[0][1]))


def end_free_group(allocator: Any, parked: Any, commit: Callable[[], None]) -> None:
    """Close ``allocator``'s open free group and run ``commit`` (what the group parked, or a
    reset that drops it).  The group is gone once ``commit`` committed, a listener failing
    after the commit included; when ``commit`` is refused, ``parked`` is put back: a call
    that raises leaves the frees it would have made waiting, not lost."""
    allocator._group = None
    try:
        commit()
    except ListenerError:
        raise
    except BaseException:
        allocator._group = parked
        raise


class ParkedPages:
    """The pages an open free group has parked, per kind of free, so that a free its end
    would refuse is refused when it is parked: nothing parked, nothing lost at the end.

    A *merged* kind is freed once per page at the end (a paged ``free`` touches a page as
    often as it likes); any other kind names each page once.  Kinds the same end frees as
    one set of pages are *rivals*: a page in two of them is freed twice."""

    def __init__(self) -> None:
        self.by_kind: dict[str, set[int]] = {}

    def new_pages(self, kind: str, rivals: Sequence[str], pages: Sequence[int], *,
                  merged: bool) -> list[int]:
        """The pages a part of ``kind`` adds to the group (``ValueError`` for one freed twice);
        records nothing (``add`` does, once every part was checked)."""
        mine = self.by_kind.get(kind, set())
        if merged:
            pages = [page for page in dict.fromkeys(pages) if page not in mine]
        seen: set[int] = set()
        for page in pages:
            if page in seen or page in mine or any(page in self.by_kind.get(rival, ())
                                                   for rival in rivals):
                raise ValueError(f"page {page} is freed twice in this free group")
            seen.add(page)
        return list(pages)

    def add(self, kind: str, pages: Sequence[int]) -> None:
        self.by_kind.setdefault(kind, set()).update(pages)


__all__ = ["ParkedPages", "end_free_group", "free_events", "refusal"]
