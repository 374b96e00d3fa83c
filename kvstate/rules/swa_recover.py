"""Rules that recover an SWA tombstone from an inserting request's slots (SGLang 0.5.23).

``SwaAdopt``: the tombstone's FULL KV is unlocked, so its FULL slot ids become
the request's (the old ones go free) and the node is live again.
``SwaRebind``: its FULL KV is locked and must keep its ids, so the request's
SWA pages move onto them (the request then frees its FULL copies).  Both
check everything before writing (``kvstate.rules``).
"""

from __future__ import annotations

from typing import Any

from kvstate.events import SwaAdopt, SwaRebind
from kvstate.records import SwaNode
from kvstate.rules.common import bump_counts, check_distinct, check_page_id, check_time
from kvstate.rules.registry import Reject, rule
from kvstate.rules.swa import credit, pool_of, swa_node
from kvstate.state import DETACHED


def _check_recovery(s: Any, pool: Any, node_id: int, pages: tuple[int, ...]) -> tuple[Any, Any]:
    """The tombstone and the incoming FULL pages of a recovery (each with a peer)."""
    node, swa = swa_node(s, node_id)
    if swa.live:
        raise Reject(f"node {node_id} is not an SWA tombstone")
    if len(pages) != len(node.pages):
        raise Reject(f"node {node_id} has {len(node.pages)} pages, {len(pages)} given")
    check_distinct(pages, "page")
    for page in pages:
        check_page_id(s, page)
        if page in s.page_node:
            raise Reject(f"page {page} is already in tree node {s.page_node[page]}")
        if page not in pool.peer:
            raise Reject(f"incoming page {page} has no SWA page")
    stale = [page for page in node.pages if page in pool.peer]
    if stale:
        raise Reject(f"tombstone {node_id} page {stale[0]} still has an SWA page")
    return node, swa


@rule(SwaAdopt)
def swa_adopt(s: Any, event: SwaAdopt) -> None:
    pool = pool_of(s)
    check_time(s, event.time)
    node, swa = _check_recovery(s, pool, event.node, event.pages)
    if node.lock_ref:
        raise Reject(f"node {event.node} is FULL-locked; its FULL pages must stay (SwaRebind)")
    holders, owner = s.holders, event.owner
    for page in event.pages:
        if holders.get(page) != (owner,):
            raise Reject(f"page {page} is not held by {owner!r} alone "
                         f"(holders {list(holders.get(page, ()))})")
    for page in node.pages:
        if page in holders or page in s.tree_refs:
            raise Reject(f"node {event.node} page {page} is still used outside the tree")
    page_node = s.page_node
    for page in node.pages:
        del page_node[page]
    old = list(node.pages)
    s.free_pages = s.free_pages.push_head(old) if event.at_head else s.free_pages.push_tail(old)
    for page in event.pages:
        del holders[page]
        page_node[page] = event.node
    if owner != DETACHED and owner in s.requests:
        bump_counts(s.tree_refs, event.pages, +1)  # the owner's row still maps them
    credit(pool, swa, len(node.key))
    written = s.node_w(event.node)
    written.pages = tuple(event.pages)
    written.swa = SwaNode(True, swa.lock_ref, swa.uuid, event.time)
    s.clock = event.time
    if s.touched is not None:
        s.touched.pages.update(old)
        s.touched.pages.update(event.pages)
        s.touched.nodes.add(event.node)


@rule(SwaRebind)
def swa_rebind(s: Any, event: SwaRebind) -> None:
    pool = pool_of(s)
    check_time(s, event.time)
    node, swa = _check_recovery(s, pool, event.node, event.pages)
    peer = pool.peer
    for kept, incoming in zip(node.pages, event.pages, strict=True):
        peer[kept] = peer.pop(incoming)
    credit(pool, swa, len(node.key))
    s.node_w(event.node).swa = SwaNode(True, swa.lock_ref, swa.uuid, event.time)
    s.clock = event.time
    if s.touched is not None:
        s.touched.pages.update(node.pages)
        s.touched.pages.update(event.pages)
        s.touched.nodes.add(event.node)
