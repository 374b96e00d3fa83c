"""Events of the block-pool mode (``Geometry.mode == "block"``, vLLM V1 semantics).

In block mode:

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

The rules live in ``kvstate.rules.block`` (tables and holders) and
``kvstate.rules.block_tree`` (the prefix tree).  Tags start with ``b``.
"""

from __future__ import annotations

from kvstate.events.base import Event, Id, Name, RequestId, Signed, Token, event

ExtraKey = tuple[Name | Signed, ...]  # one tagged extra key, e.g. ("lora", name, path)
Extra = tuple[ExtraKey, ...] | None  # a block's extra keys, or None
CacheEntry = tuple[Id, tuple[Token, ...], Extra, Id]  # (node, key tokens, extra keys, page)


@event
class BlockAlloc(Event, tag="ba", frozen=True):
    """Take ``pages`` from the head of the free queue, in order (vLLM ``get_new_blocks``).

    Each page must be uncached (lazy eviction is a ``BlockUncache`` before
    this) and gains ``holder``; a request holder appends them to its table.
    """

    holder: RequestId
    pages: tuple[Id, ...]


@event
class BlockHold(Event, tag="bh", frozen=True):
    """Add ``holder`` to ``pages`` (vLLM ``touch``); a page with no holder leaves the free queue.

    A request holder appends the pages to its table; page 0 (null) may pad a
    request table and is not held.
    """

    holder: RequestId
    pages: tuple[Id, ...]


@event
class BlockRelease(Event, tag="br", frozen=True):
    """Drop one ``holder`` entry from each page, in order (vLLM ``free_blocks``).

    Pages left with no holder join the free queue: uncached ones at the head
    (in the given order, the first becoming the head), cached ones at the
    tail; with ``cached_to_tail`` false (caching off) all go to the head.
    A request holder's table entries become page 0; with ``close`` the pages
    must be every real page of its table and the request is closed.
    Page 0 entries are skipped; a duplicate page is rejected (a double free).
    """

    holder: RequestId
    pages: tuple[Id, ...]
    cached_to_tail: bool = True
    close: bool = False


@event
class BlockCache(Event, tag="bc", frozen=True):
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

    parent: Id
    entries: tuple[CacheEntry, ...]
    stored_from: Id = 0


@event
class BlockUncache(Event, tag="bu", frozen=True):
    """Remove cached ``pages`` (copies of ``nodes``, pairwise) from the prefix tree.

    Holders and free-queue positions do not change (vLLM lazy eviction,
    ``evict_blocks``).  A node left with no copy and no child is deleted, and
    so are its ancestors that become empty and childless.
    """

    pages: tuple[Id, ...]
    nodes: tuple[Id, ...]


@event
class BlockClear(Event, tag="bz", frozen=True):
    """Drop the whole prefix tree; holders and the free queue stay (vLLM ``reset_prefix_cache``)."""


BLOCK_EVENTS = (BlockAlloc, BlockHold, BlockRelease, BlockCache, BlockUncache, BlockClear)
