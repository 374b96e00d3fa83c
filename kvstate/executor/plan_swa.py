"""Index planning for the SWA pool of a FULL + SWA hybrid (SGLang 0.5.23's SWA layers).

Pure: each planner reads the state the event applies to (``State.swa``: the
SWA free list and ``peer[full page] = swa page``) and returns an ``IndexPlan``;
importing this module registers them.  The executor keeps the sliding-window
layers in their own pool and sends every FULL slot ``s`` of a paired page to
SWA slot ``peer[s // P] * P + s % P`` (``full_to_swa_index_mapping``), so
what an SWA event means for the bytes is a change of that pairing:

    SwaAlloc    pairs FULL pages with fresh SWA pages (``swa_paired``)
    SwaFree     the FULL pages lose their SWA pages, which go back free
    SwaEvict    the same for every page of the tombstoned nodes
                (``swa_unpaired``; the SWA slots are ``swa_freed_slots``, poisoned in debug mode)
    SwaRebind   the incoming pages' SWA pages, with the KV on them, move onto the
                node's kept FULL pages (``swa_moved``, ``swa_paired``, ``swa_unpaired``); no
                byte moves
    SwaAdopt    the node takes the owner's paired FULL pages (their SWA stays with them);
                its old FULL pages go free (``freed_slots``, ``adopted``)
    SwaPublish  a tombstone whose pages are paired is live again (``swa_live_nodes``)

``SwaTouch``, ``SwaLock`` and ``SwaUnlock`` change no byte and no meaning.
The SWA part of the core events is planned here too and merged by their
planners: a ``Reset`` frees the tree's SWA pages or the whole pool
(:func:`swa_reset_part`), a ``Copy`` of two paired FULL pages copies their
SWA pages as well (:func:`swa_copy_part`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.events import SwaAdopt, SwaAlloc, SwaEvict, SwaFree, SwaPublish, SwaRebind
from kvstate.executor.index_plan import IndexPlan, node_depth, page_slots, plans


def _released(before: Any, pages: Sequence[int]) -> dict[str, Any]:
    """FULL ``pages`` lose their SWA pages, which go back free."""
    peer = before.swa.peer
    return {"swa_unpaired": tuple(pages),
            "swa_freed_slots": page_slots([peer[page] for page in pages],
                                          before.geometry.page_size)}


@plans(SwaAlloc)
def _swa_alloc(before: Any, event: SwaAlloc) -> IndexPlan:
    return IndexPlan(swa_paired=tuple(event.pairs))


@plans(SwaFree)
def _swa_free(before: Any, event: SwaFree) -> IndexPlan:
    return IndexPlan(**_released(before, event.pages))


@plans(SwaEvict)
def _swa_evict(before: Any, event: SwaEvict) -> IndexPlan:
    nodes = before.nodes
    return IndexPlan(**_released(before, [page for node_id in event.nodes
                                          for page in nodes[node_id].pages]))


@plans(SwaPublish)
def _swa_publish(before: Any, event: SwaPublish) -> IndexPlan:
    return IndexPlan(swa_live_nodes=(event.node,))


@plans(SwaRebind)
def _swa_rebind(before: Any, event: SwaRebind) -> IndexPlan:
    peer = before.swa.peer
    kept = before.nodes[event.node].pages
    return IndexPlan(swa_moved=tuple(zip(event.pages, kept, strict=True)),
                     swa_unpaired=tuple(event.pages),
                     swa_paired=tuple((page, peer[incoming])
                                      for incoming, page in zip(event.pages, kept, strict=True)),
                     swa_live_nodes=(event.node,))


@plans(SwaAdopt)
def _swa_adopt(before: Any, event: SwaAdopt) -> IndexPlan:
    size = before.geometry.page_size
    old = before.nodes[event.node].pages
    return IndexPlan(freed_slots=page_slots(old, size),
                     adopted=((event.node, node_depth(before, event.node),
                               page_slots(event.pages, size)),),
                     swa_live_nodes=(event.node,))


# -- the SWA part of core events ---------------------------------------------------------
def swa_reset_part(before: Any, scope: str) -> dict[str, Any]:
    """The SWA fields of a ``Reset`` (empty without an SWA pool): ``tree`` frees the SWA
    pages of tree pages, ``pages`` and ``all`` free every SWA page."""
    pool = before.swa
    if pool is None or scope == "rows":
        return {}
    if scope == "tree":
        page_node = before.page_node
        pages = sorted(page for page in pool.peer.keys() if page in page_node)
    else:
        pages = sorted(pool.peer.keys())
    return _released(before, pages) if pages else {}


def swa_copy_part(before: Any, src_pages: Sequence[int], dst_pages: Sequence[int]
                  ) -> dict[str, Any]:
    """The SWA fields of a ``Copy``: the SWA pages of pairs whose pages are both paired."""
    pool = before.swa
    if pool is None:
        return {}
    peer = pool.peer
    pairs = [(peer[s], peer[d]) for s, d in zip(src_pages, dst_pages, strict=True)
             if s in peer and d in peer]
    if not pairs:
        return {}
    size = before.geometry.page_size
    return {"swa_copy_src": page_slots([s for s, _ in pairs], size),
            "swa_copy_dst": page_slots([d for _, d in pairs], size)}
