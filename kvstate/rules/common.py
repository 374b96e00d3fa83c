"""Precondition checks and small edits shared by the rules (raise ``Reject``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kvstate.records import RequestId
from kvstate.rules.registry import Reject
from kvstate.state import DETACHED


def check_distinct(values: Sequence[object], what: str) -> None:
    if len(set(values)) != len(values):
        seen: set[object] = set()
        for value in values:
            if value in seen:
                raise Reject(f"duplicate {what} {value!r} in one event")
            seen.add(value)


def check_page_id(s: Any, page: int) -> None:
    if page == 0:
        raise Reject("page 0 is the reserved padding page")
    if not 1 <= page <= s.geometry.num_pages:
        raise Reject(f"page {page} is outside 1..{s.geometry.num_pages}")


def check_request(s: Any, request_id: RequestId) -> None:
    if request_id not in s.requests:
        raise Reject(f"unknown request {request_id!r}")


def check_time(s: Any, time: int) -> None:
    if time < s.clock:
        raise Reject(f"logical time {time} is before the clock {s.clock}")


def bump_counts(counts: Any, pages: Iterable[int], delta: int) -> None:
    """Add ``delta`` to each page's count in a mutable mapping, dropping zeros."""
    for page in pages:
        count = counts.get(page, 0) + delta
        if count:
            counts[page] = count
        else:
            del counts[page]


def release_pages(s: Any, request_id: RequestId, pages: Iterable[int]) -> None:
    """A request stops mapping ``pages`` (live, distinct entries): one pass over them.

    A tree page it mapped without holding loses one unheld reference
    (``tree_refs``); a page it held loses the hold, and a page left with no
    holder becomes DETACHED unless the tree holds it.  In block mode the tree
    holds nothing, so a cached page left with no holder becomes DETACHED too
    (a pool reference: never lost, and released only by ``BlockRelease``).
    """
    holders, tree_refs = s.holders, s.tree_refs
    page_node = s.page_node if s.geometry.mode == "radix" else {}
    detached = (DETACHED,)
    for page in pages:
        held = holders.get(page)
        if held is None or request_id not in held:
            if page in page_node:  # an unheld tree reference
                count = tree_refs[page] - 1
                if count:
                    tree_refs[page] = count
                else:
                    del tree_refs[page]
            continue
        if len(held) > 1:
            rest = tuple(h for h in held if h != request_id)
            if rest:
                holders[page] = rest
                continue
        if page in page_node:
            del holders[page]
        else:
            holders[page] = detached


def live_entries(pages: Sequence[int], dangling: Sequence[int], start: int = 0,
                 stop: int | None = None) -> list[int]:
    """The pages of table indices ``[start, stop)`` that are not dangling."""
    stop = len(pages) if stop is None else stop
    if not dangling:
        return list(pages[start:stop])
    gone = set(dangling)
    return [pages[i] for i in range(start, stop) if i not in gone]
