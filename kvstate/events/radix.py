"""Events of the radix mode (SGLang's pools and radix cache; also the seed-002 manager).

Request ids are row numbers (``int``, SGLang) or names (``str``).  Token
slots are ``page * page_size + offset``; page 0 is the padding sink.  The
rules live in ``kvstate.rules`` (rows, pages, tree).
"""

from __future__ import annotations

from typing import Literal

from kvstate.events.base import Event, Id, RequestId, Token, event


# -- request rows -------------------------------------------------------------
@event
class ReqAlloc(Event, tag="ra", frozen=True):
    """Open requests: int ids take those request rows, str ids are named requests."""

    requests: tuple[RequestId, ...]


@event
class ReqFree(Event, tag="rf", frozen=True):
    """Close requests; rows go back on top of the row stack in the given order.

    Pages only the request held become DETACHED (still allocated, to be freed
    or inserted by the caller): closing a row never frees KV by itself.
    """

    requests: tuple[RequestId, ...]


# -- pages ------------------------------------------------------------------
@event
class Allocate(Event, tag="al", frozen=True):
    """Take ``pages`` off the free list.

    With no ``items`` the pages are DETACHED (a bare allocator call).  Each
    item ``(request, slots)`` appends ``slots`` to that request's table at its
    current length; every page in ``pages`` must be the fresh page of exactly
    one item position, and continuing slots must extend the request's own
    partial last page.
    """

    pages: tuple[Id, ...]
    items: tuple[tuple[RequestId, tuple[Id, ...]], ...] = ()


@event
class Append(Event, tag="ap", frozen=True):
    """Commit written tokens: each item sets a request's committed length."""

    items: tuple[tuple[RequestId, Id], ...]


@event
class Assign(Event, tag="as", frozen=True):
    """Write ``slots`` into a request's table at ``start`` (SGLang's row write).

    New pages must be DETACHED (they become the request's), tree pages
    (referenced, protected by locks), or pages the request already holds.
    """

    request: RequestId
    start: Id
    slots: tuple[Id, ...]


@event
class Scatter(Event, tag="sc", frozen=True):
    """Write one slot per ``(row, position)`` (SGLang's batched ``req_to_token`` write).

    Exactly a sequence of one-slot ``Assign``s in item order, applied all or
    nothing: a decode step writes every running request's new slot at once.
    """

    items: tuple[tuple[RequestId, Id, Id], ...]


@event
class Truncate(Event, tag="tr", frozen=True):
    """Shrink a request's table to ``length`` tokens; dropped own pages become DETACHED."""

    request: RequestId
    length: Id


@event
class Free(Event, tag="fr", frozen=True):
    """Return DETACHED ``pages`` to the free list, at the head (in this order) or the tail."""

    pages: tuple[Id, ...]
    at_head: bool = False


@event
class FreeMapped(Event, tag="fm", frozen=True):
    """Free ``pages`` that a request row still maps (SGLang's ``allocator.free`` under a row).

    Each page must be held by exactly one open request alone, outside the tree.
    Its table entries become *dangling*: still in the row, no longer held,
    until the row is rewritten there, truncated or closed.  Reading a
    dangling entry (an export, a kernel) is a use after free.  Pages go to
    the free list like ``Free``'s.
    """

    pages: tuple[Id, ...]
    at_head: bool = False


@event
class Share(Event, tag="sh", frozen=True):
    """Map already-held ``slots`` into a request's table at ``start`` and add it as a holder.

    This is reference counting (vLLM's ``ref_cnt``, seed 002's shared prefix):
    each page gains the request as one more holder.  Pages must be held by
    the tree or by other requests, never free or DETACHED.
    """

    request: RequestId
    start: Id
    slots: tuple[Id, ...]


@event
class Copy(Event, tag="cp", frozen=True):
    """Copy page contents ``src_pages[i] -> dst_pages[i]`` (copy-on-write; data plane).

    The state does not change; the event exists so an executor moves the
    bytes and a log shows the copy.  Sources must be held; destinations must
    be DETACHED (freshly allocated, not yet visible to anyone).
    """

    src_pages: tuple[Id, ...]
    dst_pages: tuple[Id, ...]


# -- radix tree -------------------------------------------------------------
@event
class Insert(Event, tag="in", frozen=True):
    """Create leaf ``node`` under ``parent`` with ``key``/``slots``; ``owner``'s holds move to it."""

    parent: Id
    key: tuple[Token, ...]
    slots: tuple[Id, ...]
    node: Id
    time: Id
    owner: RequestId = 0


@event
class Split(Event, tag="sp", frozen=True):
    """Split ``node`` at token ``at``: ``new_node`` takes the top half, ``node`` keeps the rest."""

    node: Id
    at: Id
    new_node: Id
    time: Id


@event
class Touch(Event, tag="to", frozen=True):
    """Stamp ``nodes`` with access ``time`` (the logical clock never goes back)."""

    nodes: tuple[Id, ...]
    time: Id


@event
class Lock(Event, tag="lk", frozen=True):
    """Increment ``lock_ref`` on ``node`` and every ancestor below the root."""

    node: Id


@event
class Unlock(Event, tag="ul", frozen=True):
    """Decrement ``lock_ref`` on ``node`` and every ancestor below the root."""

    node: Id


@event
class Evict(Event, tag="ev", frozen=True):
    """Remove unlocked leaves in order (a parent may follow its last child).

    Pages no one else holds return to the free list: per node, in node order,
    at the head (each node's pages become the new head) or the tail.
    """

    nodes: tuple[Id, ...]
    at_head: bool = False


@event
class Reset(Event, tag="rs", frozen=True):
    """Reset ``scope``: ``tree``, ``rows``, ``pages`` or ``all`` (see ``kvstate.rules.rows``)."""

    scope: Literal["tree", "rows", "pages", "all"]


RADIX_EVENTS = (ReqAlloc, ReqFree, Allocate, Append, Assign, Scatter, Truncate, Free, FreeMapped,
                Share, Copy, Insert, Split, Touch, Lock, Unlock, Evict, Reset)
