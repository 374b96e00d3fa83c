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
* reads (no events): ``cached_prefix`` (the hit of ``get_computed_blocks``),
  ``blocks_to_allocate`` (vLLM's capacity predictor), ``check_hits``.

vLLM's per-request ``num_cached_block`` is an input and an output
(``Running``), never core state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from kvstate.events import BlockAlloc, BlockCache, BlockClear, BlockHold, BlockRelease, BlockUncache, ReqAlloc
from kvstate.planner.builder import Builder
from kvstate.state import DETACHED, ROOT, RequestId, block_child_key

NULL = 0  # the null block: pads sliding-window tables; never held, queued or cached


class BlockChain(Protocol):
    """A request's full blocks as the prefix tree keys them (``kvstate.vllm.Request`` is one)."""

    @property
    def block_keys(self) -> Sequence[tuple[Any, ...]]: ...  # child key of each full block
    @property
    def block_extra_keys(self) -> Sequence[Any]: ...  # tagged extra keys of each, or None
    def block_tokens(self, index: int) -> tuple[int, ...]: ...


@attrs.frozen
class Running:
    """vLLM's ``num_cached_block`` entry of a running request, plus a memo for the tree walk.

    ``last_node`` is the tree node of table entry ``num_cached - 1`` when known
    (ROOT: walk from the root).  Node ids are never reused, so the memo is
    right exactly while that node is still in the tree.
    """

    num_cached: int = 0
    last_node: int = ROOT


@attrs.frozen
class Allocation:
    """What ``plan_allocate_slots`` did: the blocks it took and the request's new cursor."""

    new_pages: tuple[int, ...]
    running: Running | None  # None: vLLM still treats the request as new


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# -- the pool ------------------------------------------------------------------------------
def plan_get_new_blocks(b: Builder, holder: RequestId, count: int) -> list[int]:
    """Take ``count`` pages off the free-queue head for ``holder`` (an open request or DETACHED).

    A cached head page is uncached first, all in one ``BlockUncache`` in queue
    order (vLLM emits one ``BlockRemoved`` each), then ``BlockAlloc``.
    ``ValueError`` (nothing emitted) when the queue is shorter than ``count``.
    """
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
    real = tuple(page for page in pages if page != NULL)
    if real:
        b.emit(BlockHold(DETACHED, real))


def plan_free_blocks(b: Builder, holder: RequestId, pages: Sequence[int], *, caching: bool,
                     close: bool = False) -> None:
    """Drop one ``holder`` reference per page, in order (``BlockRelease``; nulls skipped).

    Pages nobody holds any more queue as vLLM 0.33 queues them: uncached at
    the head (the first given becomes the head), cached at the tail; with
    ``caching`` off all at the head.  ``close`` ends the request's table.
    """
    real = tuple(page for page in pages if page != NULL)
    if real or close:
        b.emit(BlockRelease(holder, real, caching, close))


def plan_cache_chain(b: Builder, chain: BlockChain, pages: Sequence[int], num_cached: int,
                     num_full: int, last_node: int = ROOT) -> int:
    """Cache ``pages`` as chain positions ``[num_cached, num_full)`` (one ``BlockCache``).

    A page 0 (null or masked block) keeps its position without a copy.
    Positions before ``num_cached`` are walked from ``last_node`` when it is
    still in the tree, else from the root; any missing on the way are
    rebuilt as hollow nodes.  Returns the node of position ``num_full - 1``.
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
    for position in range(first, num_full):
        child = nodes[current].children.get(keys[position]) if walking else None
        if child is None:
            walking = False
            child, next_id = next_id, next_id + 1
        page = pages[position - num_cached] if position >= num_cached else NULL
        entries.append((child, chain.block_tokens(position), extras[position], page))
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


# -- the manager: lookups and the predictor (no events) ----------------------------------------
def skipped_tokens(window: int | None, num_computed: int) -> int:
    """Tokens before the attention window of the next token (0 for full attention)."""
    return 0 if window is None else max(0, num_computed - window + 1)


def cached_prefix(state: Any, chain: BlockChain, max_blocks: int, window: int | None) -> list[int]:
    """The hit of ``get_computed_blocks``: per position the first cached copy of its node.

    Full attention: the leading run of cached positions; sliding window:
    ``window_hit`` over the first ``max_blocks`` positions.
    """
    nodes = state.nodes
    keys = chain.block_keys
    copies: list[int] = []  # NULL: a hollow node (sliding window only)
    current = nodes[ROOT]
    for position in range(min(max_blocks, len(keys))):
        child = current.children.get(keys[position])
        if child is None:
            break
        current = nodes[child]
        if current.pages:
            copies.append(current.pages[0])
        elif window is None:
            break
        else:
            copies.append(NULL)
    if window is None:
        return copies
    copies.extend([NULL] * (max_blocks - len(copies)))
    return window_hit(copies, window, state.geometry.page_size)


def window_hit(copies: Sequence[int], window: int, block_size: int) -> list[int]:
    """A sliding-window hit from each position's cached copy (NULL: a miss), vLLM's scan.

    Right to left, the first run of ``cdiv(window - 1, block_size)`` cached
    positions ends the hit (the positions before it become NULL); with no
    such run, the leading run from position 0.
    """
    need = cdiv(window - 1, block_size)
    run = 0
    for index in range(len(copies) - 1, -1, -1):
        if copies[index] == NULL:
            run = 0
            continue
        run += 1
        if run >= need:
            return [NULL] * index + list(copies[index:index + run])
    return list(copies[:run])


def blocks_to_allocate(state: Any, request_id: RequestId, running: bool, num_tokens: int,
                       hits: Sequence[int], total_computed: int, window: int | None) -> int:
    """How many free blocks giving the request ``num_tokens`` slots consumes (vLLM's predictor).

    A running request takes no hits (``ValueError``).  A new one needs the
    blocks past its hits and the window's skipped prefix, plus every kept hit
    nobody holds (holding it takes it off the free queue).
    """
    size = state.geometry.page_size
    required = cdiv(num_tokens, size)
    record = state.requests.get(request_id)
    table = 0 if record is None else len(record.pages)
    if running:
        if hits:
            raise ValueError(f"running request {request_id!r} cannot take new prefix hits")
        return max(required - table, 0)
    skipped = skipped_tokens(window, total_computed) // size
    new = max(required - max(skipped, len(hits) + table), 0)
    holders = state.holders
    kept = hits[max(0, skipped - table):]
    return new + sum(1 for page in kept if page != NULL and page not in holders)


def check_hits(state: Any, request_id: RequestId, chain: BlockChain, running: Running | None,
               hits: Sequence[int], num_local: int, *, window: int | None, caching: bool) -> None:
    """``ValueError`` unless ``hits`` can be the ``get_computed_blocks`` hit of a new request.

    Each real hit must be a cached copy of the node at its chain position,
    once; a running request or one that already has blocks takes none.
    """
    if running is not None:
        if hits:
            raise ValueError(f"running request {request_id!r} cannot take new prefix hits")
        return
    record = state.requests.get(request_id)
    if record is not None and record.pages:
        raise ValueError(f"request {request_id!r} already has blocks; only a new request "
                         "takes prefix hits")
    if len(hits) > len(chain.block_keys):
        raise ValueError(f"{len(hits)} hit blocks for {len(chain.block_keys)} full blocks")
    skipped = skipped_tokens(window, num_local) // state.geometry.page_size
    if not caching and any(page != NULL for page in hits[skipped:]):
        raise ValueError("computed blocks must be empty when prefix caching is disabled")
    page_node, nodes, keys = state.page_node, state.nodes, chain.block_keys
    seen: set[int] = set()
    for position, page in enumerate(hits):
        if page == NULL:
            continue
        node = nodes.get(page_node.get(page, -1))
        if node is None or block_child_key(node.key, node.extra) != keys[position] or page in seen:
            raise ValueError(f"block {page} is not a cached copy of block {position} of request "
                             f"{request_id!r} (or it is given twice)")
        seen.add(page)


# -- the manager: decisions ---------------------------------------------------------------------
def plan_remove_skipped(b: Builder, request_id: RequestId, num_computed: int, *,
                        window: int | None, caching: bool) -> None:
    """Free the blocks wholly before the window (``BlockRelease``), highest index first.

    Their table entries become null; the walk stops at the first null (all
    before it were removed earlier).
    """
    record = b.state.requests.get(request_id)
    if window is None or record is None:
        return
    table = record.pages
    count = min(skipped_tokens(window, num_computed) // b.state.geometry.page_size, len(table))
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
                        caching: bool) -> Allocation | None:
    """vLLM ``allocate_slots`` once its arguments are checked; None when the pool is short.

    ``hits`` None: vLLM's empty-hit object (the request is not marked running
    by it).  In vLLM's order: the out-of-window blocks up to ``remove_upto``
    are freed (kept even when refused), the admission check (``None``, nothing
    more emitted), the hits are held behind nulls for skipped positions, the
    table grows to ``need_slots`` tokens from the queue head, and the full
    blocks up to ``cache_upto`` are cached.
    """
    state = b.state
    size = state.geometry.page_size
    given = () if hits is None else hits
    if hits is not None:
        check_hits(state, request_id, chain, running, hits, num_local, window=window,
                   caching=caching)
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


def plan_free_request(b: Builder, request_id: RequestId, *, caching: bool) -> None:
    """Release the request's whole table, last block first (tail blocks are evicted first)."""
    record = b.state.requests.get(request_id)
    if record is not None:
        plan_free_blocks(b, request_id, tuple(reversed(record.pages)), caching=caching, close=True)


def _open(b: Builder, request_id: RequestId) -> None:
    if request_id not in b.state.requests:
        b.emit(ReqAlloc((request_id,)))
