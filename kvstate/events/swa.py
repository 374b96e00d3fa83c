"""Events of the sliding-window (SWA) pool of a FULL + SWA hybrid cache (SGLang 0.5.23).

Each component change is its own fact.  FULL pages are named by their FULL
page id; the SWA page of a FULL page is its *peer* (``State.swa.peer``,
SGLang's ``full_to_swa_index_mapping``).  A tree node's SWA component is
live or a *tombstone* (``Node.swa``); the FULL rules keep it consistent
(``Insert`` derives it from the pages' peers, ``Split`` slices it, ``Evict``
and ``Free`` refuse pages that still have a peer).  The rules live in
``kvstate.rules.swa``; every time is a logical time (``State.clock``).
"""

from __future__ import annotations

from kvstate.events.base import Event, Id, RequestId, event


@event
class SwaAlloc(Event, tag="wa", frozen=True):
    """Pair each allocated FULL page with a fresh SWA page: ``pairs`` of ``(full, swa)``.

    The SWA pages come off the SWA free list (wherever they sit); the FULL
    pages must be held outside the tree and have no peer yet.
    """

    pairs: tuple[tuple[Id, Id], ...]


@event
class SwaFree(Event, tag="wf", frozen=True):
    """Return the SWA peers of FULL ``pages`` (outside the tree) to the SWA free list.

    The peers go back in the order of ``pages``, at the head (the first
    becomes the head) or the tail; the FULL pages lose their peers and stay
    allocated (SGLang's ``free_swa``: the request keeps its FULL KV).
    """

    pages: tuple[Id, ...]
    at_head: bool = False


@event
class SwaEvict(Event, tag="we", frozen=True):
    """Tombstone the SWA component of ``nodes``, in order (window-unlocked, live).

    Each node's peers go back node by node (at the head: each node's block
    becomes the new head).  The nodes keep their FULL KV; a leaf that goes
    entirely is tombstoned here and then removed by ``Evict``.
    """

    nodes: tuple[Id, ...]
    at_head: bool = False


@event
class SwaPublish(Event, tag="wp", frozen=True):
    """A tombstoned ``node`` whose FULL pages all have peers becomes live (SGLang's
    ``SWARebuild``), entering the SWA LRU as its most recent entry at ``time``."""

    node: Id
    time: Id


@event
class SwaTouch(Event, tag="wt", frozen=True):
    """Move live ``nodes`` (deepest first, each an ancestor of the one before) to the
    most recent end of the SWA LRU at ``time``, the first one most recent of all."""

    nodes: tuple[Id, ...]
    time: Id


@event
class SwaLock(Event, tag="wl", frozen=True):
    """Lock the SWA window from ``node`` up to ``top`` (both included; ``top`` = 0: up
    to the root) once more.

    The window's upper end gets the receipt ``uuid`` (0 when it reached the
    root): the one it already carries, or else the pool's next receipt.
    Every node of the window must hold a FULL lock above its SWA locks.
    """

    node: Id
    top: Id
    uuid: Id


@event
class SwaUnlock(Event, tag="wu", frozen=True):
    """Release one SWA window lock: from ``node`` up to the node carrying receipt
    ``uuid`` (0: up to the root)."""

    node: Id
    uuid: Id


@event
class SwaAdopt(Event, tag="wd", frozen=True):
    """Recover a FULL-unlocked SWA tombstone with ``owner``'s fresh pages.

    ``node``'s FULL pages are replaced by ``pages`` (held by ``owner`` alone,
    each with a peer; the owner's holds move to the tree), its old FULL pages
    go back free (at the head as one block, or the tail), and the node becomes
    live at ``time``.  SGLang: the node's cached FULL slot ids change.
    """

    node: Id
    pages: tuple[Id, ...]
    owner: RequestId
    time: Id
    at_head: bool = False


@event
class SwaRebind(Event, tag="wb", frozen=True):
    """Recover an SWA tombstone whose FULL KV must stay (it is locked): the peers of
    ``pages`` (outside the tree) move onto the node's own FULL pages, one for one,
    and the node becomes live at ``time``.  ``pages`` keep no peer (free them next)."""

    node: Id
    pages: tuple[Id, ...]
    time: Id


SWA_EVENTS = (SwaAlloc, SwaFree, SwaEvict, SwaPublish, SwaTouch, SwaLock, SwaUnlock, SwaAdopt,
              SwaRebind)


def _refresh_codec() -> None:
    # The codec is built over the event types registered when it was imported; these
    # register later, so it is rebuilt once to cover them (kvstate.events.codec).
    from kvstate.events.codec import CODEC

    if SwaAlloc.TAG not in CODEC.types:
        CODEC.refresh()


_refresh_codec()
