"""The incremental checker's page checks: one changed page against the named invariants.

``page_violations(live, mapped_by, page)`` checks a page the rules reported
(``Touched.pages``) or whose table entries changed: conservation (free or
held, never both), its holders against the tables that map it, the tree
node it claims, and the index of tree pages mapped without a hold.
``mapped_by`` is the checker's shadow (page -> requests whose tables map
it).  ``suspect_pages`` first drops the pages a few lookups prove clean, so
the usual page costs no generator.  Reads only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvstate.invariants.registry import Violation
from kvstate.records import RequestId
from kvstate.state import DETACHED

_POOL_HOLD = (DETACHED,)  # a page held by a bare allocator call (radix) or the pool (block)


def suspect_pages(live: Any, mapped_by: dict[int, set[RequestId]], pages: set[int]) -> list[int]:
    """The pages of ``pages`` that ``page_violations`` must look at: all but those a quick
    test proves clean.  Radix mode: free and unmapped; held by one request that alone
    maps it, or DETACHED and unmapped; a tree page its node lists, with the right count
    of holdless mappers.  Block mode: free and unmapped; held by exactly the requests
    that map it, or by the pool alone (DETACHED) and unmapped; a cached page its node
    lists.  At page size 1 a prefill touches a page per token, so the usual page costs
    a few lookups, not a generator; every other case gets the full check, which names
    the violation."""
    mode = live.geometry.mode
    if mode != "radix" and mode != "block":
        return list(pages)
    block = mode == "block"
    num_pages = live.geometry.num_pages
    held_by, node_of, free = live.holders.get, live.page_node.get, live.free_pages
    mappers_of, refs_of, nodes = mapped_by.get, live.tree_refs.get, live.nodes
    node_pages: dict[int, frozenset[int]] = {}  # each tree node's pages, once per check
    suspect: list[int] = []
    for page in pages:
        held, node_id = held_by(page), node_of(page)
        taken = held is not None if block else (held is not None or node_id is not None)
        if (page in free) == taken or not 0 < page <= num_pages:
            suspect.append(page)  # conservation, or a page outside 1..N
            continue
        mappers = mappers_of(page)
        if held is None:
            unheld = len(mappers) if mappers else 0
        elif held == _POOL_HOLD:
            if mappers:
                suspect.append(page)
                continue
            unheld = 0
        elif block:  # the requests holding it are exactly those mapping it, once each
            if not mappers or len(held) != len(mappers) or mappers != set(held):
                suspect.append(page)
                continue
            unheld = 0
        elif len(held) == 1 and mappers and len(mappers) == 1 and held[0] in mappers:
            unheld = 0
        else:
            suspect.append(page)
            continue
        if node_id is None or block:
            if unheld or (not block and refs_of(page, 0)):
                suspect.append(page)
                continue
            if node_id is None:
                continue
        elif refs_of(page, 0) != unheld:
            suspect.append(page)
            continue
        listed = node_pages.get(node_id)
        if listed is None:
            node = nodes.get(node_id)
            if node is None:
                suspect.append(page)
                continue
            listed = node_pages[node_id] = frozenset(node.pages)
        if page not in listed:
            suspect.append(page)
    return suspect


def page_violations(live: Any, mapped_by: dict[int, set[RequestId]], page: int) -> Iterator[Violation]:
    """Every named invariant of one changed page (conservation, refcounts, node_shape, table_refs_live)."""
    block = live.geometry.mode == "block"
    held = live.holders.get(page)
    node_id = live.page_node.get(page)
    free = page in live.free_pages
    if not 1 <= page <= live.geometry.num_pages:
        if held is not None or node_id is not None or free:
            yield Violation("conservation", f"page {page} outside 1..N is tracked")
        return
    taken = held is not None if block else (held is not None or node_id is not None)
    if free and taken:
        yield Violation("conservation", f"page {page} is both free and held")
    elif not free and not taken:
        yield Violation("conservation", f"page {page} is neither free nor held (leaked)")
    mappers = mapped_by.get(page, set())
    if held is not None:
        for message in _holders(page, held, mappers, block):
            yield Violation("refcounts", message)
    if node_id is not None:
        node = live.nodes.get(node_id)
        if node is None or page not in node.pages:
            yield Violation("node_shape", f"page {page} claims tree node {node_id}, "
                                          "which does not hold it")
    held = held or ()
    if block:
        for request_id in mappers:
            if request_id not in held:
                yield Violation("table_refs_live", f"request {request_id!r} maps page {page}, "
                                                   "which it does not hold")
        return
    unheld = [r for r in mappers if r not in held]
    if node_id is None and unheld:
        yield Violation("table_refs_live", f"request {unheld[0]!r} maps page {page}, which "
                                           "neither it nor the tree holds")
    expected = len(unheld) if node_id is not None else 0
    if live.tree_refs.get(page, 0) != expected:
        yield Violation("table_refs_live", "the index of tree pages mapped without a hold is "
                                           f"off at page {page}")


def _holders(page: int, held: tuple[RequestId, ...], mappers: set[RequestId],
             block: bool) -> Iterator[str]:
    if not held:
        yield f"page {page} has an empty holder entry"
    if block:
        requests = [h for h in held if h != DETACHED or isinstance(h, str)]
        if len(requests) != len(set(requests)):
            yield f"page {page} lists a request holder twice: {list(held)}"
    else:
        requests = list(held)
        if len(held) != len(set(held)):
            yield f"page {page} lists a holder twice: {list(held)}"
    for holder in requests:
        if holder == DETACHED and not isinstance(holder, str):
            if len(held) > 1:
                yield f"page {page} is DETACHED and held by requests {list(held)}"
            continue
        if holder not in mappers:
            yield f"page {page} is held by request {holder!r} but not in its table"
