"""Block-pool planning: every decision vLLM 0.33's block pool and KV-cache manager make.

The vLLM front end (``kvstate.vllm``) keeps vLLM's API, the requests'
tokens and hashes, and the KV-event stream; which blocks a call takes,
holds, caches, frees or evicts is decided here, from the state a builder
``b`` shows, and emitted as block events (``kvstate.events.block``) in
vLLM's order.  Every function checks what it can refuse before its first
event, so a refused call emits nothing.  Page 0 is the null block.

* pool: ``plan_get_new_blocks`` (lazy eviction: ``BlockUncache`` of cached
  head pages, then ``BlockAlloc``), ``plan_touch`` (``BlockHold``),
  ``plan_free_blocks`` (``BlockRelease``), ``plan_cache_chain`` (one
  ``BlockCache``), ``plan_uncache`` (``BlockUncache``), ``plan_reset``
  (``BlockClear``);
* manager: ``plan_allocate_slots`` (window ``BlockRelease``, the admission
  check, ``ReqAlloc`` + ``BlockHold`` of the hits, new blocks, ``BlockCache``),
  ``plan_cache_blocks``, ``plan_remove_skipped``, ``plan_free_request``;
* reads (no events) are in ``kvstate.planner.block_hits``.

vLLM's per-request ``num_cached_block`` is an input and an output
(``Running``), never core state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from kvstate.events import BlockAlloc, BlockCache, BlockClear, BlockHold, BlockRelease, BlockUncache, ReqAlloc
from kvstate.planner.alloc import cdiv
from kvstate.planner.block_hits import (
    NULL,
    BlockChain,
    Running,
    blocks_to_allocate,
    check_hits,
    skipped_tokens,
)
from kvstate.planner.builder import Builder
from kvstate.state import DETACHED, ROOT, RequestId


@attrs.frozen
class Allocation:
    """What ``plan_allocate_slots`` did: the blocks it took and the request's new cursor."""

    new_pages: tuple[int, ...]
    running: Running | None  # None: vLLM still treats the request as new


# -- the pool ------------------------------------------------------------------------------
def plan_get_new_blocks(b: Builder, holder: RequestId, count: int) -> list[int]:
    """Take ``count`` pages off the free-queue head for ``holder`` (an open request or DETACHED):
    ``BlockUncache`` of the cached ones among them (lazy eviction), then ``BlockAlloc``.
    ``ValueError`` (nothing emitted) when the queue is shorter."""
    state = b.state
    if count > len(state.free_pages):
        raise ValueError(f"Cannot get {count} free blocks from the pool")
    if count <= 0:
        return []
    pages = state.free_pages.head(count)
    page_node = state.page_node
    if page_node:
        cached = [page for page in pages if page in page_node]
        if cached:
            b.emit(BlockUncache(tuple(cached), tuple(page_node[page] for page in cached)))
    b.emit(BlockAlloc(holder, tuple(pages)))
    return pages


def plan_touch(b: Builder, pages: Sequence[int]) -> None:
    """One more anonymous (pool-level) reference on each page; the null block is skipped."""
    real = tuple([page for page in pages if page != NULL]) if NULL in pages else tuple(pages)
    if real:
        b.emit(BlockHold(DETACHED, real))


def plan_free_blocks(b: Builder, holder: RequestId, pages: Sequence[int], *, caching: bool,
                     close: bool = False) -> None:
    """Drop one ``holder`` reference per page, in order (``BlockRelease``; nulls skipped).

    Pages nobody holds any more queue as in vLLM 0.33: uncached at the head
    (the first given becomes the head), cached at the tail; ``caching`` off:
    all at the head.  ``close`` ends the request's table.
    """
    real = tuple([page for page in pages if page != NULL]) if NULL in pages else tuple(pages)
    if real or close:
        b.emit(BlockRelease(holder, real, caching, close))


def plan_cache_chain(b: Builder, chain: BlockChain, pages: Sequence[int], num_cached: int,
                     num_full: int, last_node: int = ROOT) -> int:
    """Cache ``pages`` as chain positions ``[num_cached, num_full)`` (one ``BlockCache``).

    A page 0 (null or masked block) keeps its position without a copy.
    Positions before ``num_cached`` are walked from ``last_node`` when it is
    still in the tree, else from the root; any missing on the way are
    rebuilt as hollow nodes.  Returns the node of position ``num_full - 1``.
    A block's tokens are the first ``page_size`` items of its child key
    (``kvstate.state.block_child_key``).
    """
    state = b.state
    nodes = state.nodes
    keys = chain.block_keys
    if num_cached and last_node != ROOT and last_node in nodes:
        current, first = last_node, num_cached
    else:
        current, first = ROOT, 0
        while first < num_cached:
            child = nodes[current].children.get(keys[first])
            if child is None:
                break
            current, first = child, first + 1
    parent = current
    entries = []
    next_id = state.next_node_id
    walking = True  # still on existing nodes; once one is missing, every later one is new
    extras = chain.block_extra_keys
    size = state.geometry.page_size
    # A chain may keep each block's tokens as a tuple (``Request.block_token_keys``): the event
    # and the tree node then share it instead of slicing the child key again.
    tokens = getattr(chain, "block_token_keys", None)
    for position in range(first, num_full):
        key = keys[position]
        child = nodes[current].children.get(key) if walking else None
        if child is None:
            walking = False
            child, next_id = next_id, next_id + 1
        page = pages[position - num_cached] if position >= num_cached else NULL
        entries.append((child, key[:size] if tokens is None else tokens[position],
                        extras[position], page))
        current = child
    b.emit(BlockCache(parent, tuple(entries), num_cached - first))
    return current


def plan_uncache(b: Builder, pages: Sequence[int]) -> None:
    """vLLM ``evict_blocks``: uncache the cached ones of ``pages`` (first occurrence order)."""
    page_node = b.state.page_node
    cached = tuple(dict.fromkeys(page for page in pages if page in page_node))
    if cached:
        b.emit(BlockUncache(cached, tuple(page_node[page] for page in cached)))


def plan_reset(b: Builder) -> bool:
    """vLLM ``reset_prefix_cache``: ``BlockClear`` only when every block is free."""
    state = b.state
    if len(state.free_pages) != state.geometry.num_pages:
        return False
    b.emit(BlockClear())
    return True


# -- the manager: decisions ---------------------------------------------------------------------
def plan_remove_skipped(b: Builder, request_id: RequestId, num_computed: int, *,
                        window: int | None, caching: bool) -> None:
    """Free the blocks wholly before the window (``BlockRelease``), highest index first.

    Their table entries become null; the walk stops at the first null (all
    before it were removed earlier).
    """
    if window is None:
        return
    state = b.state
    record = state.requests.get(request_id)
    if record is None:
        return
    table = record.pages
    count = min(skipped_tokens(window, num_computed) // state.geometry.page_size, len(table))
    if not count or table[count - 1] == NULL:  # nothing left the window since the last call
        return
    pages = []
    for index in range(count - 1, -1, -1):
        if table[index] == NULL:
            break
        pages.append(table[index])
    plan_free_blocks(b, request_id, pages, caching=caching)


def plan_cache_blocks(b: Builder, request_id: RequestId, chain: BlockChain,
                      running: Running | None, num_tokens: int) -> Running | None:
    """Cache the request's full blocks up to ``num_tokens`` (vLLM ``cache_blocks``).

    Returns the new cursor (unchanged when nothing is new).  ``ValueError``
    (nothing emitted) when the table is shorter than the blocks to cache.
    """
    size = b.state.geometry.page_size
    num_cached = 0 if running is None else running.num_cached
    num_full = min(num_tokens, len(chain.block_keys) * size) // size
    if num_cached >= num_full:
        return running
    record = b.state.requests.get(request_id)
    table = () if record is None else record.pages
    if len(table) < num_full:
        raise ValueError(f"request {request_id!r} has {len(table)} blocks, fewer than "
                         f"{num_full} full blocks to cache")
    memo = ROOT if running is None else running.last_node
    last = plan_cache_chain(b, chain, tuple(table[num_cached:num_full]), num_cached, num_full, memo)
    return Running(num_full, last)


def plan_allocate_slots(b: Builder, request_id: RequestId, chain: BlockChain,
                        running: Running | None, hits: Sequence[int] | None, *, num_local: int,
                        need_slots: int, cache_upto: int, remove_upto: int, window: int | None,
                        caching: bool, full_tokens: int | None = None,
                        cap: int | None = None) -> Allocation | None:
    """vLLM ``allocate_slots`` once its arguments are checked; None when the pool is short.

    ``hits`` None: vLLM's empty-hit object (the request is not marked running
    by it).  ``full_tokens`` set: first vLLM's full-sequence admission check
    (the window's blocks counted at most ``cap``), None with no event when the
    whole sequence would not fit.  In vLLM's order: the out-of-window blocks up to ``remove_upto``
    are freed (kept even when refused), the admission check (``None``, nothing
    more emitted), the hits are held behind nulls for skipped positions, the
    table grows to ``need_slots`` tokens from the queue head, and the full
    blocks up to ``cache_upto`` are cached.  Bad hits raise ``ValueError``
    before any event (``check_hits``).
    """
    state = b.state
    size = state.geometry.page_size
    given = () if hits is None else hits
    if hits is not None:
        check_hits(state, request_id, chain, running, hits, num_local, window=window,
                   caching=caching)
    if full_tokens is not None and blocks_to_allocate(
            state, request_id, running is not None, full_tokens, given, num_local, window,
            cap) > len(state.free_pages):
        return None
    plan_remove_skipped(b, request_id, remove_upto, window=window, caching=caching)
    needed = blocks_to_allocate(b.state, request_id, running is not None, need_slots, given,
                                num_local, window)
    if needed > len(b.state.free_pages):
        return None
    if hits is not None and running is None:
        skipped = skipped_tokens(window, num_local) // size
        pages = (NULL,) * skipped + tuple(hits[skipped:])
        if pages:
            _open(b, request_id)
            b.emit(BlockHold(request_id, pages))
        running = Running(len(pages))
    record = b.state.requests.get(request_id)
    count = cdiv(need_slots, size) - (0 if record is None else len(record.pages))
    new_pages: list[int] = []
    if count > 0:
        _open(b, request_id)
        new_pages = plan_get_new_blocks(b, request_id, count)
    if caching:
        running = plan_cache_blocks(b, request_id, chain, running, cache_upto)
    return Allocation(tuple(new_pages), running)


def allocation_is_idle(state: Any, request_id: RequestId, chain: BlockChain,
                       running: Running | None, *, need_slots: int, cache_upto: int,
                       caching: bool) -> bool:
    """Whether ``plan_allocate_slots`` without hits, without the full-sequence check and
    without a window would emit nothing and keep ``running`` (most decode steps: the table
    already covers ``need_slots`` and no block became full).  Reads only; False is always
    safe (the caller then plans in full)."""
    record = state.requests.get(request_id)
    if record is None:
        return False
    size = state.geometry.page_size
    if -(-need_slots // size) > len(record.pages):
        return False  # the table grows
    num_cached = 0 if running is None else running.num_cached
    return not caching or num_cached >= min(cache_upto, len(chain.block_keys) * size) // size


def plan_free_request(b: Builder, request_id: RequestId, *, caching: bool) -> None:
    """Release the request's whole table, last block first (tail blocks are evicted first)."""
    record = b.state.requests.get(request_id)
    if record is not None:
        plan_free_blocks(b, request_id, record.pages[::-1], caching=caching, close=True)


def _open(b: Builder, request_id: RequestId) -> None:
    if request_id not in b.state.requests:
        b.emit(ReqAlloc((request_id,)))
