"""Precondition helpers shared by the reducer rules (pure, raise ``Reject``)."""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
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
    if not pages:  # the usual case for a list: nothing to rebuild
        return tree_refs
    with tree_refs.mutate() as out:
        bump_counts(out, pages, delta)
        result = out.finish()
    return result


class _PageTables(Protocol):
    """What the helpers below read: a frozen ``State`` or a ``TransientState``."""

    @property
    def page_node(self) -> Container[int]: ...
    @property
    def holders(self) -> Mapping[int, tuple[RequestId, ...]]: ...


def unheld_tree_pages(state: _PageTables, request_id: RequestId, pages: Iterable[int]) -> list[int]:
    """Those of ``pages`` that are tree pages ``request_id`` maps without holding."""
    page_node, holders = state.page_node, state.holders
    return [p for p in pages if p in page_node and request_id not in holders.get(p, ())]


class _Holders(Protocol):
    def get(self, key: int, /) -> tuple[RequestId, ...] | None: ...
    def __setitem__(self, key: int, value: tuple[RequestId, ...], /) -> None: ...
    def __delitem__(self, key: int, /) -> None: ...


def drop_holds(holders: _Holders, page_node: Container[int], request_id: RequestId,
               pages: Iterable[int]) -> None:
    """Drop ``request_id``'s hold on ``pages`` in place (a dict or a map mutation).

    A page left with no holder becomes DETACHED unless the tree holds it; pages
    the request references but does not hold (tree pages) are skipped.
    Shared by the reducer and the transient rules.
    """
    for page in pages:
        held = holders.get(page)
        if held is None or request_id not in held:
            continue
        if len(held) > 1:  # the usual single holder needs no new tuple
            rest = tuple(h for h in held if h != request_id)
            if rest:
                holders[page] = rest
                continue
        if page in page_node:
            del holders[page]
        else:
            holders[page] = (DETACHED,)


def release_holds(
    holders: Map[int, tuple[RequestId, ...]],
    page_node: Map[int, int],
    request_id: RequestId,
    pages: Iterable[int],
) -> Map[int, tuple[RequestId, ...]]:
    """``drop_holds`` on a persistent map: the new map."""
    with holders.mutate() as out:
        drop_holds(out, page_node, request_id, pages)
        result = out.finish()
    return result
