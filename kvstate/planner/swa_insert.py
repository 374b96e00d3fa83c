"""FULL + SWA hybrid insert (SGLang 0.5.23's ``UnifiedTreeCore`` insert with its SWA component).

The inserting request has an SWA *cursor*: positions below it have lost
their SWA KV already (freed out of the window), so the tree keeps them as
SWA tombstones.  The walk, in SGLang's order (page-aligned key; P = page)::

    walked node:  Touch; Split where the key diverges (+ Touch of the lower half)
                  a tombstone overlapping [cursor, ...) is recovered from the
                  request's slots: SwaAdopt (its FULL slot ids become the
                  request's; the old ones go free) or, when its FULL is
                  locked, SwaRebind (the request's SWA pages move onto the
                  kept FULL slots; the request's FULL slots go free); a
                  tombstone straddling the cursor is split there first
                  the request's duplicate slots of [prev_prefix_len, ...) are
                  freed: FULL-only below the cursor, both pools above
    new leaf:     Insert (a tombstone below the cursor, live above it: two
                  Inserts when it straddles), capped by a Split into
                  [older | last ceil(window / P) * P tokens] so one window
                  lock pins one window of SWA
    then:         SwaTouch of the target and its window ancestors

Frees go where SGLang's allocator puts them: at the tail with page size 1,
at the head (in row order) with pages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from kvstate.events import Free, FreeMapped, Insert, SwaAdopt, SwaFree, SwaRebind, Touch
from kvstate.planner.builder import Builder
from kvstate.planner.swa_match import refresh_window, split_node
from kvstate.planner.tree_ops import common_prefix
from kvstate.state import DETACHED, ROOT, RequestId, expand_pages


class UnifiedInsert(msgspec.Struct, frozen=True, gc=False):
    prefix_len: int  # tokens the tree had already (the request's copies of them are freed)
    last_node: int
    branch_inserted: bool = False  # the key reached the request's SWA branching seqlen


class InsertSpec(msgspec.Struct, frozen=True, gc=False):
    """What SGLang's ``InsertParams`` carry for the SWA component."""

    window: int
    prev_prefix_len: int = 0  # the request's tree-owned prefix: never its to free
    cursor: int = 0  # the request's SWA eviction cursor (page-aligned)
    branching_seqlen: int | None = None
    at_head: bool = False


def plan_unified_insert(b: Builder, key: Sequence[int], pages: Sequence[int], owner: RequestId,
                        spec: InsertSpec) -> UnifiedInsert:
    """Insert page-aligned ``key`` backed by ``pages`` (one FULL page per key page, held by
    ``owner``: a request row, or DETACHED for a bare allocation)."""
    state = b.state
    size = state.geometry.page_size
    aligned = len(key) // size * size
    tokens = tuple(key[:aligned])
    values = list(pages[: aligned // size])
    if not tokens:
        return UnifiedInsert(0, ROOT)
    node_id, total = ROOT, 0
    child_key = state.geometry.child_key
    while total < aligned:
        child_id = b.state.nodes[node_id].children.get(child_key(tokens[total:total + size]))
        if child_id is None:
            break
        b.emit(Touch((child_id,), b.state.clock + 1))
        child = b.state.nodes[child_id]
        matched = common_prefix(child.key, tokens, total) // size * size
        if matched < len(child.key):
            child_id = split_node(b, child_id, matched)
        consumed = _overlap(b, child_id, total, matched, values, owner, spec)
        _free_duplicates(b, total, matched, consumed, values, spec)
        node_id, total = child_id, total + matched
    target = node_id
    if total < aligned:
        target = _new_leaf(b, node_id, tokens, values, total, owner, spec)
    if target != ROOT:
        refresh_window(b, target, spec.window)
    branching = spec.branching_seqlen
    inserted = branching is not None and len(key) >= branching
    return UnifiedInsert(total, target, inserted)


def _overlap(b: Builder, node_id: int, total: int, matched: int, values: list[int],
             owner: RequestId, spec: InsertSpec) -> int:
    """Recover an overlapped SWA tombstone inside the request's live window; the offset
    (within the node) from which the request's slots now belong to the tree."""
    if spec.prev_prefix_len >= total + matched:
        return matched
    if b.state.nodes[node_id].swa.live:
        return matched
    live_start = max(total, spec.cursor)
    if live_start >= total + matched:
        return matched
    if live_start > total:  # the part below the cursor stays a tombstone (the new top)
        split_node(b, node_id, live_start - total)
    size = b.state.geometry.page_size
    incoming = tuple(values[live_start // size: (total + matched) // size])
    time = b.state.clock + 1
    if b.state.nodes[node_id].lock_ref:
        b.emit(SwaRebind(node_id, incoming, time))
        free_full(b, incoming, spec.at_head)
    else:
        b.emit(SwaAdopt(node_id, incoming, owner, time, spec.at_head))
    return live_start - total


def _free_duplicates(b: Builder, total: int, matched: int, consumed: int, values: list[int],
                     spec: InsertSpec) -> None:
    """Free the request's copies of ``[max(prev_prefix_len, total), total + consumed)``:
    FULL only below its SWA cursor (their SWA is gone), both pools above."""
    start = max(0, spec.prev_prefix_len - total)
    if start >= consumed:
        return
    size = b.state.geometry.page_size
    first, stop = total + start, total + consumed
    cut = min(max(spec.cursor, first), stop)
    if cut > first:
        free_full(b, values[first // size: cut // size], spec.at_head)
    if stop > cut:
        free_both(b, values[cut // size: stop // size], spec.at_head)


def _new_leaf(b: Builder, parent: int, tokens: tuple[int, ...], values: list[int], total: int,
              owner: RequestId, spec: InsertSpec) -> int:
    """The tail leaf: a tombstone part below the cursor, a live part capped at a window."""
    size = b.state.geometry.page_size
    end = len(tokens)
    live_start = min(max(total, spec.cursor), end)
    if live_start > total:
        parent = _insert(b, parent, tokens, values, total, live_start, owner)
    if live_start == end:
        return parent
    leaf = _insert(b, parent, tokens, values, live_start, end, owner)
    tail = -(-spec.window // size) * size
    length = end - live_start
    if length > tail:
        split_node(b, leaf, length - tail)
    return leaf


def _insert(b: Builder, parent: int, tokens: tuple[int, ...], values: list[int], start: int,
            stop: int, owner: RequestId) -> int:
    size = b.state.geometry.page_size
    node_id = b.state.next_node_id
    slots = expand_pages(values[start // size: stop // size], size)
    b.emit(Insert(parent, tokens[start:stop], slots, node_id, b.state.clock + 1, owner))
    return int(node_id)


# -- frees ------------------------------------------------------------------------------
def free_full(b: Builder, pages: Sequence[int], at_head: bool) -> None:
    """Free FULL ``pages`` (which hold no SWA peer): ``Free`` for bare allocations,
    ``FreeMapped`` for pages a request row still maps, in SGLang's order."""
    if not pages:
        return
    holders = b.state.holders
    runs: list[tuple[bool, list[int]]] = []
    for page in pages:
        mapped = holders.get(page) != (DETACHED,)
        if runs and runs[-1][0] == mapped:
            runs[-1][1].append(page)
        else:
            runs.append((mapped, [page]))
    if at_head:
        runs.reverse()  # each run goes on the head: the first must be pushed last
    for mapped, run in runs:
        b.emit(FreeMapped(tuple(run), at_head) if mapped else Free(tuple(run), at_head))


def free_both(b: Builder, pages: Sequence[int], at_head: bool) -> None:
    """Free ``pages`` and their SWA peers (SGLang's ``free_segment``: SWA first)."""
    if not pages:
        return
    b.emit(SwaFree(tuple(pages), at_head))
    free_full(b, pages, at_head)


def pages_of(state: Any, request_id: RequestId, start: int, stop: int) -> list[int]:
    """The pages of row positions ``[start, stop)`` (page-aligned start), in row order."""
    if stop <= start:
        return []
    size = state.geometry.page_size
    table = state.requests[request_id].pages
    return [int(table[index]) for index in range(start // size, -(-stop // size))]
