"""The replay summary's per-event counters.

``measure_before(state, evt)`` reads what a counter needs from the state
*before* the event (the tokens a request's first write found in the tree,
the tokens an eviction removes); ``count_after`` adds it in once the event
was accepted, with the event's own counts and the pages in use after it.
The state may be a frozen ``State`` or a ``LiveState``.  Mutates only the
``Summary`` and the pending set it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvstate.events import Allocate, Assign, BlockAlloc, BlockHold, BlockUncache, Evict, ReqAlloc, Share

if TYPE_CHECKING:
    from kvstate.events import Event
    from kvstate.replay.run import Summary


def _hit_tokens(state: Any, evt: Any) -> int:
    record = state.requests.get(evt.request)
    if evt.start or record is None or record.allocated:
        return 0
    size, tree = state.geometry.page_size, state.page_node
    return sum(1 for slot in evt.slots if slot // size in tree)


def _evicted_tokens(state: Any, evt: Any) -> int:
    nodes = state.nodes
    return sum(len(nodes[n].key) for n in evt.nodes if n in nodes)


_BEFORE: dict[type, Callable[[Any, Any], int]] = {
    Assign: _hit_tokens, Share: _hit_tokens, Evict: _evicted_tokens,
}


def measure_before(state: Any, evt: Event) -> int:
    """What the event's counter needs from the state before it (0 for most events)."""
    measure = _BEFORE.get(type(evt))
    return measure(state, evt) if measure is not None else 0


def _allocate(summary: Summary, pending: set[Any], evt: Any, _: int) -> None:
    if pending:  # a request's first allocation is its prefill
        for request_id, slots in evt.items:
            if request_id in pending:
                pending.discard(request_id)
                summary.prefill_tokens += len(slots)


def _req_alloc(summary: Summary, pending: set[Any], evt: Any, _: int) -> None:
    summary.requests += len(evt.requests)
    pending.update(evt.requests)


def _hits(summary: Summary, _: set[Any], __: Any, hit_tokens: int) -> None:
    summary.prefix_hit_tokens += hit_tokens


def _evict(summary: Summary, _: set[Any], evt: Any, evicted_tokens: int) -> None:
    summary.evictions += 1
    summary.evicted_nodes += len(evt.nodes)
    summary.evicted_tokens += evicted_tokens


def _block_hold(summary: Summary, _: set[Any], evt: Any, __: int) -> None:
    summary.block_hits += sum(1 for page in evt.pages if page)  # page 0 pads, not a hit


def _block_alloc(summary: Summary, _: set[Any], evt: Any, __: int) -> None:
    summary.blocks_allocated += len(evt.pages)


def _block_uncache(summary: Summary, _: set[Any], evt: Any, __: int) -> None:
    summary.blocks_uncached += len(evt.pages)


_AFTER: dict[type, Callable[[Summary, set[Any], Any, int], None]] = {
    Allocate: _allocate, ReqAlloc: _req_alloc, Assign: _hits, Share: _hits, Evict: _evict,
    BlockHold: _block_hold, BlockAlloc: _block_alloc, BlockUncache: _block_uncache,
}


def count_after(summary: Summary, pending: set[Any], evt: Event, measure: int,
                pages_used: int) -> None:
    """Count an accepted event (``pending``: requests still waiting for their first allocation)."""
    by_type = summary.by_type
    tag = evt.TAG
    by_type[tag] = by_type.get(tag, 0) + 1
    if pages_used > summary.peak_pages_used:  # any event type may take pages
        summary.peak_pages_used = pages_used
    count = _AFTER.get(type(evt))
    if count is not None:
        count(summary, pending, evt, measure)
