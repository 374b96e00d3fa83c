"""Index planning for block-mode events (vLLM V1 block pool): ``BlockAlloc`` .. ``BlockClear``.

Pure (no torch, no clock): each planner reads the state one block event
applies to and returns an :class:`~kvstate.executor.plan.IndexPlan`.
Importing this module registers the planners with ``plan.plans``.

No block event copies bytes: vLLM never copies a block.  What the plans say:

    BlockAlloc   a request's new pages: ``new_tokens`` (the forward pass writes them);
                 a pool-level (DETACHED) allocation maps nothing
    BlockHold    a request's prefix-cache hits: ``linked_tokens`` (they read KV another
                 request computed); null page 0 entries: ``nulled_tokens``
    BlockRelease pages left with no holder and no cached copy: ``freed_slots``; a request's
                 released entries become null (``nulled_tokens``), or with ``close`` the
                 request is ``closed``
    BlockCache   each page that became a cached copy: ``cached_blocks`` (node, depth, slots)
    BlockUncache / BlockClear   ``uncached_pages``; those no one holds: ``freed_slots``

Cached pages keep their bytes while they wait in the free queue, so a page
is garbage only once it is neither held nor cached.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvstate.events import BlockAlloc, BlockCache, BlockClear, BlockHold, BlockRelease, BlockUncache
from kvstate.executor.index_plan import EMPTY_PLAN, IndexPlan, TokenRef, depth_below, page_slots, plans
from kvstate.state import DETACHED, RequestId


def _is_request(holder: RequestId) -> bool:
    """True for a request holder; the int ``DETACHED`` is the pool-level reference."""
    return isinstance(holder, str) or holder != DETACHED


def _table_tokens(request: RequestId, first_position: int, pages: Iterable[int], size: int
                  ) -> tuple[list[TokenRef], list[TokenRef]]:
    """``(real, null)`` token refs of ``pages`` appended to a table at ``first_position``."""
    real: list[TokenRef] = []
    null: list[TokenRef] = []
    position = first_position
    for page in pages:
        target = null if page == 0 else real
        target.extend((request, position + offset, page * size + offset) for offset in range(size))
        position += size
    return real, null


def _take(before: Any, event: BlockAlloc | BlockHold) -> IndexPlan:
    """Pages appended to a request's table: fresh ones it computes, or cached hits it links."""
    if not _is_request(event.holder):
        return EMPTY_PLAN
    start = before.requests[event.holder].allocated
    real, null = _table_tokens(event.holder, start, event.pages, before.geometry.page_size)
    if isinstance(event, BlockAlloc):
        # Allocated pages are the free-queue head, which never holds the null page 0
        # (the rules reject anything else), so ``null`` is empty here.
        return IndexPlan(new_tokens=tuple(real))
    return IndexPlan(linked_tokens=tuple(real), nulled_tokens=tuple(null))


@plans(BlockAlloc)
def _block_alloc(before: Any, event: BlockAlloc) -> IndexPlan:
    return _take(before, event)


@plans(BlockHold)
def _block_hold(before: Any, event: BlockHold) -> IndexPlan:
    return _take(before, event)


@plans(BlockRelease)
def _block_release(before: Any, event: BlockRelease) -> IndexPlan:
    holders, page_node = before.holders, before.page_node
    # A page is garbage once its last holder entry goes and it is not a cached copy.
    real = [page for page in event.pages if page]
    freed = page_slots([page for page in real
                        if len(holders[page]) == 1 and page not in page_node],
                       before.geometry.page_size)
    holder = event.holder
    if not _is_request(holder):
        return IndexPlan(freed_slots=freed)
    if event.close:
        return IndexPlan(freed_slots=freed, closed=(holder,))
    size = before.geometry.page_size
    released = set(real)
    nulled: list[TokenRef] = []
    for index, page in enumerate(before.requests[holder].pages):
        if page in released:
            start = index * size
            nulled.extend((holder, start + offset, offset) for offset in range(size))
    return IndexPlan(freed_slots=freed, nulled_tokens=tuple(nulled))


@plans(BlockCache)
def _block_cache(before: Any, event: BlockCache) -> IndexPlan:
    size = before.geometry.page_size
    # The entries are one chain under ``parent``: entry i starts i blocks below it.
    base = depth_below(before, event.parent)
    cached = tuple((node_id, base + index * size, page_slots((page,), size))
                   for index, (node_id, _key, _extra, page) in enumerate(event.entries) if page)
    return IndexPlan(cached_blocks=cached)


def _uncache(before: Any, pages: Iterable[int]) -> IndexPlan:
    holders = before.holders
    pages = tuple(pages)
    freed = [page for page in pages if page not in holders]
    return IndexPlan(freed_slots=page_slots(freed, before.geometry.page_size),
                     uncached_pages=pages)


@plans(BlockUncache)
def _block_uncache(before: Any, event: BlockUncache) -> IndexPlan:
    return _uncache(before, event.pages)


@plans(BlockClear)
def _block_clear(before: Any, event: BlockClear) -> IndexPlan:
    return _uncache(before, sorted(before.page_node.keys()))
