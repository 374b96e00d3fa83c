"""Index planning for block-mode events (vLLM V1 block pool): ``BlockAlloc`` .. ``BlockClear``.

Pure (no torch, no clock): each planner reads the states before and after
one block event and returns an :class:`~kvstate.executor.plan.IndexPlan`.
Importing this module registers the planners with ``plan.plans``.

No block event moves bytes: vLLM never copies a block.  What the plans say:

    BlockAlloc   a request's new pages: ``new_tokens`` (the forward pass writes them);
                 a pool-level (DETACHED) allocation maps nothing
    BlockHold    a request's prefix-cache hits: ``linked_tokens`` (they read KV another
                 request computed); null page 0 entries: ``nulled_tokens``
    BlockRelease pages left with no holder and no cached copy: ``freed_slots``; a request's
                 released entries become null (``nulled_tokens``), or with ``close`` the
                 request is ``closed``
    BlockCache   each page that became a cached copy: ``cached_blocks`` (node, depth, slots)
    BlockUncache / BlockClear   uncached pages that no one holds: ``freed_slots``

Cached pages keep their bytes while they wait in the free queue, so a page
is garbage only once it is neither held nor cached.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvstate.events import Event
from kvstate.events_block import (
    BlockAlloc,
    BlockCache,
    BlockClear,
    BlockHold,
    BlockRelease,
    BlockUncache,
)
from kvstate.executor.plan import EMPTY_PLAN, IndexPlan, TokenRef, node_depth, page_slots, plans
from kvstate.state import DETACHED, ROOT, RequestId, State


def _is_request(holder: RequestId) -> bool:
    """True for a request holder; the int ``DETACHED`` is the pool-level reference."""
    return isinstance(holder, str) or holder != DETACHED


def _unowned(after: State, pages: Iterable[int]) -> tuple[int, ...]:
    """Slots of the real pages that are neither held nor cached in ``after`` (their bytes are garbage)."""
    size = after.geometry.page_size
    holders, page_node = after.holders, after.page_node
    gone = [page for page in dict.fromkeys(pages)
            if page and page not in holders and page not in page_node]
    return page_slots(gone, size)


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


@plans(BlockAlloc)
@plans(BlockHold)
def _block_take(before: State, after: State, event: Event) -> IndexPlan:
    """Pages appended to a request's table: fresh ones it computes, or cached hits it links."""
    assert isinstance(event, (BlockAlloc, BlockHold))
    if not _is_request(event.holder):
        return EMPTY_PLAN
    start = before.requests[event.holder].allocated
    real, null = _table_tokens(event.holder, start, event.pages, before.geometry.page_size)
    if isinstance(event, BlockAlloc):
        # Allocated pages are the free-queue head, which never holds the null page 0
        # (both reducers reject anything else), so ``null`` is empty here.
        return IndexPlan(new_tokens=tuple(real))
    return IndexPlan(linked_tokens=tuple(real), nulled_tokens=tuple(null))


@plans(BlockRelease)
def _block_release(before: State, after: State, event: Event) -> IndexPlan:
    assert isinstance(event, BlockRelease)
    freed = _unowned(after, event.pages)
    holder = event.holder
    if not _is_request(holder):
        return IndexPlan(freed_slots=freed)
    if event.close:
        return IndexPlan(freed_slots=freed, closed=(holder,))
    size = before.geometry.page_size
    released = {page for page in event.pages if page}
    nulled: list[TokenRef] = []
    for index, page in enumerate(before.requests[holder].pages):
        if page in released:
            start = index * size
            nulled.extend((holder, start + offset, offset) for offset in range(size))
    return IndexPlan(freed_slots=freed, nulled_tokens=tuple(nulled))


@plans(BlockCache)
def _block_cache(before: State, after: State, event: Event) -> IndexPlan:
    assert isinstance(event, BlockCache)
    size = before.geometry.page_size
    parent = event.parent
    # The entries are one chain under ``parent``: entry i starts i blocks below it.
    base = 0 if parent == ROOT else node_depth(after, parent) + len(after.nodes[parent].key)
    cached = tuple((node_id, base + index * size, page_slots((page,), size))
                   for index, (node_id, _key, _extra, page) in enumerate(event.entries) if page)
    return IndexPlan(cached_blocks=cached)


@plans(BlockUncache)
def _block_uncache(before: State, after: State, event: Event) -> IndexPlan:
    assert isinstance(event, BlockUncache)
    return IndexPlan(freed_slots=_unowned(after, event.pages))


@plans(BlockClear)
def _block_clear(before: State, after: State, event: Event) -> IndexPlan:
    assert isinstance(event, BlockClear)
    return IndexPlan(freed_slots=_unowned(after, before.page_node.keys()))
