"""Fact events of the block-pool mode (``Geometry.mode == "block"``, vLLM V1 semantics).

Owned by the vLLM front end (issue 7); the rules live in
``kvstate.reducer.block`` and are rejected in radix mode.  In block mode:

* a page is free (in ``free_pages``, no holder) or held by one or more
  holders: open requests (at most once each; the page sits in the request's
  table) or ``DETACHED`` (0), a pool-level anonymous reference that may
  repeat (vLLM's ``ref_cnt`` is the number of holder entries);
* independently of that, a page may be *cached*: a physical copy of one node
  of the prefix tree, where every node is exactly one page-sized block keyed
  by its tokens and its tagged extra keys.  A cached page with no holder stays
  in the free queue (an eviction candidate) until it is uncached;
* page 0 is the null block: it may fill request-table positions (sliding
  window), is never held, queued or cached.

Events are immutable values that record outcomes; replay never consults
policy.  Tags are two letters starting with ``b``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from kvstate.events import Event, RequestId, event, ints


def _holder(value: Any) -> RequestId:
    return value if isinstance(value, str) else int(value)


def _deep_tuple(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_deep_tuple(item) for item in value)
    return value


CacheEntry = tuple[int, tuple[int, ...], Any, int]


def cache_entries(values: Iterable[Any]) -> tuple[CacheEntry, ...]:
    """Normalise ``(node, key tokens, extra keys, page)`` entries (lists from a log become tuples)."""
    out = []
    for node, key, extra, page in values:
        out.append((int(node), ints(key), _deep_tuple(extra), int(page)))
    return tuple(out)


@event("ba")
@attrs.frozen
class BlockAlloc(Event):
    """Take ``pages`` from the head of the free queue, in order (vLLM ``get_new_blocks``).

    Each page must be uncached (lazy eviction is a ``BlockUncache`` before
    this) and gains ``holder``; a request holder appends them to its table.
    """

    holder: RequestId = attrs.field(converter=_holder)
    pages: tuple[int, ...] = attrs.field(converter=ints)


@event("bh")
@attrs.frozen
class BlockHold(Event):
    """Add ``holder`` to ``pages`` (vLLM ``touch``); a page with no holder leaves the free queue.

    A request holder appends the pages to its table; page 0 (null) may pad a
    request table and is not held.
    """

    holder: RequestId = attrs.field(converter=_holder)
    pages: tuple[int, ...] = attrs.field(converter=ints)


@event("br")
@attrs.frozen
class BlockRelease(Event):
    """Drop one ``holder`` entry from each page, in order (vLLM ``free_blocks``).

    Pages left with no holder join the free queue: uncached ones at the head
    (in the given order, the first becoming the head), cached ones at the
    tail; with ``cached_to_tail`` false (caching off) all go to the head.
    A request holder's table entries become page 0; with ``close`` the pages
    must be every real page of its table and the request is closed.
    Page 0 entries are skipped; a duplicate page is rejected (a double free).
    """

    holder: RequestId = attrs.field(converter=_holder)
    pages: tuple[int, ...] = attrs.field(converter=ints)
    cached_to_tail: bool = attrs.field(default=True, converter=bool)
    close: bool = attrs.field(default=False, converter=bool)


@event("bc")
@attrs.frozen
class BlockCache(Event):
    """Cache pages as copies of prefix-tree nodes along one chain (vLLM ``cache_full_blocks``).

    Starting under ``parent``, each entry ``(node, key, extra, page)`` walks
    to the child keyed by ``key`` (one page of tokens) and ``extra`` (tagged
    extra keys or None): ``node`` names the existing child, or is the next
    node id and creates it (empty, "hollow").  ``page`` 0 only ensures the
    node exists (a null block or a chain position cached earlier); any other
    page becomes the node's newest copy and must be held and uncached.
    Entries before ``stored_from`` only build the path (their page is 0); the
    rest are the blocks of this call (one ``BlockStored``).
    """

    parent: int = attrs.field(converter=int)
    entries: tuple[CacheEntry, ...] = attrs.field(converter=cache_entries)
    stored_from: int = attrs.field(default=0, converter=int)


@event("bu")
@attrs.frozen
class BlockUncache(Event):
    """Remove cached ``pages`` (copies of ``nodes``, pairwise) from the prefix tree.

    Holders and free-queue positions do not change (vLLM lazy eviction,
    ``evict_blocks``).  A node left with no copy and no child is deleted, and
    so are its ancestors that become empty and childless.
    """

    pages: tuple[int, ...] = attrs.field(converter=ints)
    nodes: tuple[int, ...] = attrs.field(converter=ints)


@event("bz")
@attrs.frozen
class BlockClear(Event):
    """Drop the whole prefix tree; holders and the free queue stay (vLLM ``reset_prefix_cache``)."""
