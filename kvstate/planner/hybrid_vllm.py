"""Hybrid KV-cache decisions: vLLM 0.33's ``HybridKVCacheCoordinator`` and its managers.

Every group of a request is its own core request (``group_holders``) and
every group's chain its own prefix-tree path, so the block events of
``kvstate.events.block`` express a hybrid model unchanged: the groups share
the one free queue (page pool), each group's table is a request table
(page 0 = null block), each group caches along its own path.  The reads are
in ``kvstate.planner.hybrid_hits``; the per-group steps reuse
``kvstate.planner.block`` (new blocks from the queue head, frees, caching
a chain).  Functions take a builder ``b``, check what they can refuse
before their first event, and emit in vLLM's order.  The per-request
``GroupCursor`` tuple is an input and an output, never core state.

* ``plan_hybrid_allocate``: ``allocate_slots`` (full-sequence admission
  check, ``remove_skipped_blocks``, the capacity check, the hits of every
  group held, new blocks group by group, caching);
* ``plan_hybrid_remove_skipped``, ``plan_hybrid_cache``, ``plan_hybrid_free``.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstate.events import BlockHold, ReqAlloc
from kvstate.planner.alloc import cdiv
from kvstate.planner.block import (
    plan_cache_chain,
    plan_free_blocks,
    plan_free_request,
    plan_get_new_blocks,
    plan_remove_skipped,
)
from kvstate.planner.block_hits import NULL, Running, check_hits
from kvstate.planner.builder import Builder
from kvstate.planner.hybrid_hits import (
    CACHED,
    FULL,
    MAMBA,
    SWA,
    FreshStates,
    GroupCursor,
    GroupedRequest,
    HybridLayout,
    reachable_boundaries,
    retained,
    skipped_blocks,
)
from kvstate.planner.hybrid_step import blocks_needed
from kvstate.state import ROOT

Cursors = tuple[GroupCursor, ...]


# What ``plan_hybrid_allocate`` did: per group the blocks it returns (vLLM's new blocks; Mamba's
# include the nulls it padded with), or None when refused; the request's cursors (they change
# even on a refusal: blocks left the window first); the Mamba states it cached.  A plain tuple.
HybridAllocation = tuple[tuple[tuple[int, ...], ...] | None, Cursors, tuple[tuple[int, bytes], ...]]


def plan_hybrid_allocate(b: Builder, layout: HybridLayout, holders: Sequence[str],
                         request: GroupedRequest, cursors: Cursors,
                         hits: Sequence[Sequence[int]] | None, *, num_local: int,
                         need_slots: int, main_tokens: int, cache_upto: int, remove_upto: int,
                         full_tokens: int | None, fresh: FreshStates,
                         hits_found_here: bool = False) -> HybridAllocation:
    """vLLM ``allocate_slots`` for a hybrid layout once its arguments are checked.

    ``holders``: the request's core request per group (``group_holders``).
    ``hits`` None is vLLM's empty-hit object (the request is not marked as
    tracked by it).  ``full_tokens`` set: first the full-sequence admission
    check (sliding windows capped), refused with no event.  Then, in vLLM's
    order: blocks leaving each group's window or state are freed (kept even
    when refused), the capacity check, the hits held (nulls for skipped
    positions), each group's new blocks, and caching up to ``cache_upto``.
    Bad hits raise ``ValueError`` before any event (``hits_found_here``: the
    caller's own lookup found them in this state; see ``check_hits``).
    """
    state = b.state
    rules = layout.rules
    size = state.geometry.page_size
    if hits is not None:
        for group, rule in enumerate(rules):
            check_hits(state, holders[group], request.group_chain(group), cursors[group].cached,
                       hits[group], num_local, window=rule.window or None,
                       caching=layout.caching, found_here=hits_found_here,
                       real_from=max(0, skipped_blocks(rule, num_local, size)))
    hashes = request.block_hashes
    if full_tokens is not None and blocks_needed(
            state, layout, holders, hashes, cursors, hits, num_tokens=full_tokens,
            main_tokens=full_tokens, total_computed=num_local, admission=True,
            fresh=fresh) > len(state.free_pages):
        return None, cursors, ()
    if layout.releases:
        cursors = plan_hybrid_remove_skipped(b, layout, holders, cursors, remove_upto)
        state = b.state
    if blocks_needed(state, layout, holders, hashes, cursors, hits, num_tokens=need_slots,
                     main_tokens=main_tokens, total_computed=num_local, admission=False,
                     fresh=fresh) > len(state.free_pages):
        return None, cursors, ()
    if hits is not None and not any(map(CACHED, cursors)):
        cursors = _hold_hits(b, layout, holders, cursors, hits, num_local, size)
    required = -(-need_slots // size)
    new_pages: list[tuple[int, ...]] = []
    for group, rule in enumerate(rules):
        holder = holders[group]
        record = b.state.requests.get(holder)
        length = 0 if record is None else len(record.pages)
        if rule.kind == MAMBA:
            pages = _mamba_new_blocks(b, holder, main_tokens, length)
        elif required > length:
            if record is None:
                b.emit(ReqAlloc((holder,)))
            pages = tuple(plan_get_new_blocks(b, holder, required - length))
        else:
            pages = ()
        new_pages.append(pages)
    added: tuple[tuple[int, bytes], ...] = ()
    if layout.caching:
        cursors, added = plan_hybrid_cache(b, layout, holders, request, cursors, cache_upto)
    return tuple(new_pages), cursors, added


def _hold_hits(b: Builder, layout: HybridLayout, holders: Sequence[str], cursors: Cursors,
               hits: Sequence[Sequence[int]], num_local: int, size: int) -> Cursors:
    """Every group's hits first (so no group's new blocks evict another's hits), nulls for the
    positions a group skips; the groups that hold anything are opened in one ``ReqAlloc``.
    Each cursor remembers the tree node of its last hit (caching continues from there)."""
    held = []
    for group, rule in enumerate(layout.rules):
        skipped = max(0, skipped_blocks(rule, num_local, size))
        held.append((NULL,) * skipped + tuple(hits[group][skipped:]))
    requests = b.state.requests
    opened = tuple([holders[group] for group, pages in enumerate(held)
                    if pages and holders[group] not in requests])
    if opened:
        b.emit(ReqAlloc(opened))
    page_node = b.state.page_node
    touched = []
    for group, pages in enumerate(held):
        last = ROOT
        if pages:
            b.emit(BlockHold(holders[group], pages))
            if pages[-1] != NULL:
                last = page_node[pages[-1]]
        cursor = cursors[group]
        touched.append(GroupCursor(Running(len(pages), last), cursor.retired))
    return tuple(touched)


def _mamba_new_blocks(b: Builder, holder: str, main_tokens: int,
                      length: int) -> tuple[int, ...]:
    """Mamba "align": the table (``length`` entries) covers the tokens with nulls and one
    running-state block at the end (the previous one is retired by a later step's
    ``_mamba_remove``)."""
    required = cdiv(main_tokens, b.state.geometry.page_size)
    if required <= length:
        return ()
    pads = (NULL,) * max(0, required - 1 - length)
    _open(b, holder)
    if pads:
        b.emit(BlockHold(holder, pads))
    pages = plan_get_new_blocks(b, holder, required - length - len(pads))
    return (*pads, *pages)


def plan_hybrid_remove_skipped(b: Builder, layout: HybridLayout, holders: Sequence[str],
                               cursors: Cursors, num_computed: int) -> Cursors:
    """Free what each group no longer reads at ``num_computed`` tokens, group by group.

    Sliding window: the blocks before the window (``BlockRelease``, highest
    index first, stopping at the first null).  Mamba: every state block below
    ``num_computed - 1`` not retired yet (nulls skipped; the state of two steps
    back is among them).  Freed entries become null.
    """
    out: list[GroupCursor] | None = None
    for group, rule in enumerate(layout.rules):
        if rule.kind == SWA:
            plan_remove_skipped(b, holders[group], num_computed - rule.extra_retained,
                                window=rule.window, caching=layout.caching)
        elif rule.kind == MAMBA:
            cursor = _mamba_remove(b, holders[group], cursors[group], num_computed,
                                   layout.caching)
            if cursor is not cursors[group]:
                out = out or list(cursors)
                out[group] = cursor
    return cursors if out is None else tuple(out)


def _mamba_remove(b: Builder, holder: str, cursor: GroupCursor, num_computed: int,
                  caching: bool) -> GroupCursor:
    state = b.state
    record = state.requests.get(holder)
    if record is None:
        return cursor
    size = state.geometry.page_size
    table = record.pages
    last = min((num_computed - 1) // size, len(table)) if num_computed > 1 else 0
    if cursor.retired < last:
        pages = [table[index] for index in range(last - 1, cursor.retired - 1, -1)
                 if table[index] != NULL]
        plan_free_blocks(b, holder, pages, caching=caching)
        cursor = GroupCursor(cursor.cached, last)
    # vLLM then frees the state block of two steps back (``last_state_block_idx``) when it
    # lies below ``cdiv(num_computed, size) - 1``, which is ``last``: every entry below
    # ``last`` (and below ``retired``) is null by now, so that free never happens.
    return cursor


def plan_hybrid_cache(b: Builder, layout: HybridLayout, holders: Sequence[str],
                      request: GroupedRequest, cursors: Cursors,
                      num_tokens: int) -> tuple[Cursors, tuple[tuple[int, bytes], ...]]:
    """vLLM's coordinator ``cache_blocks``: each group caches its newly full blocks (one
    ``BlockCache`` per group with new blocks; nulls and blocks outside the retention mask keep
    their chain position without a copy).  Returns the cursors and the Mamba states cached."""
    size = b.state.geometry.page_size
    if layout.hybrid:
        num_tokens = num_tokens // size * size  # hits land on scheduler blocks
    num_full = min(num_tokens, len(request.block_hashes) * size) // size
    prompt_state = layout.has_mamba and num_tokens > 0 and \
        num_tokens == (request.num_prompt_tokens - 1) // size * size
    out: list[GroupCursor] | None = None
    fresh: list[tuple[int, bytes]] = []
    for group, cursor in enumerate(cursors):
        cached = cursor.cached
        num_cached = 0 if cached is None else cached.num_cached
        if num_cached < num_full:
            out = out or list(cursors)
            out[group] = _cache_group(b, layout, group, holders[group], request, cursor,
                                      num_cached, num_full, fresh)
        if prompt_state and layout.rules[group].kind == MAMBA:
            fresh.extend(_recache_prompt_state(b, group, holders[group], request, num_tokens))
    return (cursors if out is None else tuple(out)), tuple(fresh)


def _cache_group(b: Builder, layout: HybridLayout, group: int, holder: str,
                 request: GroupedRequest, cursor: GroupCursor, num_cached: int, num_full: int,
                 fresh: list[tuple[int, bytes]]) -> GroupCursor:
    """One group's ``cache_blocks``: blocks ``[num_cached, num_full)`` of its table, masked by
    the retention rule, in one ``BlockCache``; a Mamba group's cached states join ``fresh``."""
    state = b.state
    record = state.requests.get(holder)
    table = () if record is None else record.pages
    if len(table) < num_full:
        raise ValueError(f"request {holder!r} has {len(table)} blocks, fewer "
                         f"than {num_full} full blocks to cache")
    rule = layout.rules[group]
    pages = table[num_cached:num_full]
    if rule.kind != FULL:
        mask = retained(rule, layout.retention, num_cached, num_full,
                        state.geometry.page_size, reachable_boundaries(request))
        if mask is not None:
            pages = [page if keep else NULL for page, keep in zip(pages, mask, strict=True)]
    memo = ROOT if cursor.cached is None else cursor.cached.last_node
    last = plan_cache_chain(b, request.group_chain(group), pages, num_cached, num_full, memo)
    if rule.kind == MAMBA:
        hashes = request.block_hashes
        fresh.extend((group, hashes[num_cached + index])
                     for index, page in enumerate(pages) if page != NULL)
    return GroupCursor(Running(num_full, last), cursor.retired)


def _recache_prompt_state(b: Builder, group: int, holder: str, request: GroupedRequest,
                          num_tokens: int) -> list[tuple[int, bytes]]:
    """vLLM's Mamba partial-tail step at block granularity: when caching reaches the prompt's
    last aligned boundary and the state block there lost its cache entry (``evict_blocks``), it
    is cached again (one ``BlockCache``, one ``BlockStored``)."""
    index = num_tokens // b.state.geometry.page_size - 1
    record = b.state.requests.get(holder)
    if record is None or index >= len(record.pages):
        return []
    page = record.pages[index]
    if page == NULL or page in b.state.page_node:
        return []
    plan_cache_chain(b, request.group_chain(group), (page,), index, index + 1)
    return [(group, request.block_hashes[index])]


def plan_hybrid_free(b: Builder, holders: Sequence[str], *, caching: bool) -> None:
    """Free the request group by group, each table last block first (``BlockRelease``, close)."""
    for holder in holders:
        plan_free_request(b, holder, caching=caching)


def _open(b: Builder, holder: str) -> None:
    if holder not in b.state.requests:
        b.emit(ReqAlloc((holder,)))
