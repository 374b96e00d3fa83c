"""Precondition helpers shared by the reducer rules (pure, raise ``Reject``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from immutables import Map

from kvstate.reducer import Reject
from kvstate.state import DETACHED, RequestId, State


def check_distinct(values: Sequence[object], what: str) -> None:
    if len(set(values)) != len(values):
        seen: set[object] = set()
        for value in values:
            if value in seen:
                raise Reject(f"duplicate {what} {value!r} in one event")
            seen.add(value)


def check_page_id(state: State, page: int) -> None:
    if page == 0:
        raise Reject("page 0 is the reserved padding page")
    if not 1 <= page <= state.geometry.num_pages:
        raise Reject(f"page {page} is outside 1..{state.geometry.num_pages}")


def check_request(state: State, request_id: RequestId) -> None:
    if request_id not in state.requests:
        raise Reject(f"unknown request {request_id!r}")


def check_time(state: State, time: int) -> None:
    if time < state.clock:
        raise Reject(f"logical time {time} is before the clock {state.clock}")


class Counts(Protocol):
    """What ``bump_counts`` needs: a dict, or an ``immutables`` map mutation."""

    def get(self, key: int, default: int, /) -> int: ...
    def __setitem__(self, key: int, value: int, /) -> None: ...
    def __delitem__(self, key: int, /) -> None: ...


def bump_counts(counts: Counts, pages: Iterable[int], delta: int) -> None:
    """Add ``delta`` to each page's count in place, dropping zeros (mutates ``counts``).

    Shared by the reducer (on a ``Map`` mutation) and the transient rules (on a dict).
    """
    for page in pages:
        count = counts.get(page, 0) + delta
        if count:
            counts[page] = count
        else:
            del counts[page]


def adjust_tree_refs(
    tree_refs: Map[int, int], pages: Iterable[int], delta: int
) -> Map[int, int]:
    """Add ``delta`` to the unheld-reference count of each page (dropping zeros)."""
    with tree_refs.mutate() as out:
        bump_counts(out, pages, delta)
        result = out.finish()
    return result


def unheld_tree_pages(state: State, request_id: RequestId, pages: Iterable[int]) -> list[int]:
    """Those of ``pages`` that are tree pages ``request_id`` maps without holding."""
    page_node, holders = state.page_node, state.holders
    return [p for p in pages if p in page_node and request_id not in holders.get(p, ())]


def release_holds(
    holders: Map[int, tuple[RequestId, ...]],
    page_node: Map[int, int],
    request_id: RequestId,
    pages: Iterable[int],
) -> Map[int, tuple[RequestId, ...]]:
    """Drop ``request_id``'s hold on ``pages``; a page left with no holder becomes DETACHED.

    Pages the request references but does not hold (tree pages) are skipped.
    """
    with holders.mutate() as out:
        for page in pages:
            held = out.get(page)
            if held is None or request_id not in held:
                continue
            rest = tuple(h for h in held if h != request_id)
            if rest:
                out[page] = rest
            elif page in page_node:
                del out[page]
            else:
                out[page] = (DETACHED,)
        result = out.finish()
    return result
