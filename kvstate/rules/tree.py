"""Rules for the radix tree: insert, split, touch, lock, unlock, evict.

Sizes: a node's tokens count as ``protected`` while its ``lock_ref > 0`` and
as ``evictable`` otherwise; the root (id 0, empty key) is locked once, forever,
and lock walks never touch it.  A split keeps the *bottom* half under the old
node id, so a handle taken before the split still covers the whole prefix::

    before:  parent -> node[key a+b]
    after:   parent -> new_node[key a] -> node[key b]

With a host tier, a backed-up node's host pages split with it, and an
evicted backed-up node stays in the tree as host-only (``kvstate.rules.host``).
With an SWA pool (``kvstate.rules.swa``) the node's SWA component follows:
an inserted node is live when its pages have SWA peers (a tombstone when none
has), a split gives both halves the same component (the window receipt moves
to the top half, the node's older edge), a FULL unlock never drops below the
SWA window locks, and only SWA tombstones are evicted (``SwaEvict`` first).
With a Mamba pool (``kvstate.rules.mamba``) a node's state stays with the
bottom half of a split (the node id it had), a FULL unlock never drops below
the node's Mamba locks, and a node whose state is still cached is not
evicted (``MambaEvict`` first).
"""

from __future__ import annotations

from itertools import repeat
from operator import contains
from typing import Any

from kvstate.events import Evict, Insert, Lock, Split, Touch, Unlock
from kvstate.records import HostNode, MNode, SwaNode
from kvstate.rules.common import bump_counts, check_distinct, check_page_id, check_time
from kvstate.rules.mamba_clauses import refuse_evict, refuse_unlock
from kvstate.rules.registry import Reject, rule
from kvstate.state import DETACHED, ROOT, expand_pages, pages_of


def _node(s: Any, node_id: int) -> Any:
    node = s.nodes.get(node_id)
    if node is None:
        raise Reject(f"unknown tree node {node_id}")
    return node


def _check_fresh(s: Any, node_id: int) -> None:
    if node_id != s.next_node_id:
        raise Reject(f"new node id must be {s.next_node_id}, got {node_id}")


@rule(Insert)
def insert(s: Any, event: Insert) -> None:
    key, slots, size = event.key, event.slots, s.geometry.page_size
    if s.host is not None and key:
        hidden = s.host.evicted_children.get((event.parent, s.geometry.child_key(key)))
        if hidden is not None:
            raise Reject(f"host-only node {hidden} already starts with this key under node "
                         f"{event.parent}; load it back first")
    parent = _node(s, event.parent)
    _check_fresh(s, event.node)
    check_time(s, event.time)
    if not key:
        raise Reject("insert of an empty key")
    if len(slots) != len(key):
        raise Reject(f"value length {len(slots)} differs from key length {len(key)}")
    if len(key) % size:
        raise Reject(f"key length {len(key)} is not a multiple of page size {size}")
    child_key = s.geometry.child_key(key)
    if child_key in parent.children:
        raise Reject(f"node {event.parent} already has a child starting with {child_key!r}")
    pages = pages_of(slots, size)
    if size > 1 and expand_pages(pages, size) != tuple(slots):  # (at size 1 pages are slots)
        raise Reject(f"slots {list(slots[:8])}... are not whole pages in order")
    check_distinct(pages, "page")
    holders, page_node, owner = s.holders, s.page_node, event.owner
    # Every page checked in C first; the loop that names the first bad page runs only on a
    # refusal (at page size 1 a page is a token, so these loops are the insert's cost).  A
    # page outside the pool has no holder, so the holder test also sends it to that loop.
    held_list = list(map(holders.get, pages))
    if (None in held_list or not all(map(contains, held_list, repeat(owner)))
            or any(map(page_node.__contains__, pages))):
        for page, held in zip(pages, held_list, strict=True):
            check_page_id(s, page)
            if page in page_node:
                raise Reject(f"page {page} is already in tree node {page_node[page]}")
            if held is None or owner not in held:
                raise Reject(f"page {page} is not held by owner {owner!r}")
    swa = _inserted_swa(s, pages, event.time)
    if sum(map(len, held_list)) == len(pages):  # the owner was every page's only holder
        for page in pages:
            del holders[page]
    else:
        for page, held in zip(pages, held_list, strict=True):
            rest = () if len(held) == 1 else tuple(h for h in held if h != owner)
            if rest:
                holders[page] = rest
            else:
                del holders[page]
    page_node.update(dict.fromkeys(pages, event.node))
    s.add_node(event.node, MNode(event.parent, tuple(key), tuple(pages), s.new_children(), 0,
                                 event.time, swa=swa))
    if swa is not None and swa.live:
        s.swa.evictable += len(key)
    s.node_w(event.parent).children[child_key] = event.node
    leaves = s.leaves
    if event.parent in leaves:
        del leaves[event.parent]
    leaves[event.node] = None
    if owner != DETACHED and owner in s.requests:
        # The owner keeps mapping the pages; its hold moved to the tree.
        bump_counts(s.tree_refs, pages, +1)
    s.next_node_id = event.node + 1
    s.clock = event.time
    s.evictable_size += len(key)
    if s.touched is not None:
        s.touched.pages.update(pages)
        s.touched.nodes.update((event.node, event.parent))


def _inserted_swa(s: Any, pages: list[int], time: int) -> SwaNode | None:
    """A new node's SWA component: live when every page has an SWA peer, a tombstone
    when none has (``None`` without an SWA pool)."""
    if s.swa is None:
        return None
    paired = sum(map(s.swa.peer.__contains__, pages))
    if paired and paired != len(pages):
        raise Reject(f"{paired} of the {len(pages)} pages have SWA pages: a node is live or a "
                     "tombstone as a whole (insert the two parts separately)")
    return SwaNode(True, 0, 0, time) if paired else SwaNode()


@rule(Split)
def split(s: Any, event: Split) -> None:
    if event.node == ROOT:
        raise Reject("cannot split the root")
    node = _node(s, event.node)
    _check_fresh(s, event.new_node)
    check_time(s, event.time)
    at, size = event.at, s.geometry.page_size
    if at <= 0:
        raise Reject(f"split at {at}: must be inside the key")
    if at >= len(node.key):
        raise Reject(f"split at {at} is at or beyond the key length {len(node.key)}")
    if at % size:
        raise Reject(f"split at {at} is off a page boundary (page size {size})")
    geometry = s.geometry
    key, cut = node.key, at // size
    top_children = s.new_children()
    top_children[geometry.child_key(key[at:])] = event.node
    top = MNode(node.parent, key[:at], node.pages[:cut], top_children, node.lock_ref, event.time,
                None, node.lock_ref, node.swa)  # the top half keeps the window receipt
    s.node_w(node.parent).children[geometry.child_key(key)] = event.new_node
    page_node = s.page_node
    for page in top.pages:
        page_node[page] = event.new_node
    bottom = s.node_w(event.node)
    bottom.parent, bottom.key, bottom.pages = event.new_node, key[at:], node.pages[cut:]
    swa = node.swa
    if swa is not None and swa.uuid:
        bottom.swa = SwaNode(swa.live, swa.lock_ref, 0, swa.stamp)
    s.add_node(event.new_node, top)
    s.next_node_id = event.new_node + 1
    s.clock = event.time
    host = s.host
    if host is not None and event.node in host.backup:
        host_pages = host.backup[event.node]
        host.backup[event.new_node], host.backup[event.node] = host_pages[:cut], host_pages[cut:]
        for page in host_pages[:cut]:
            host.owner[page] = event.new_node
    if s.touched is not None:
        s.touched.pages.update(top.pages)
        s.touched.nodes.update((event.node, event.new_node, top.parent))


@rule(Touch)
def touch(s: Any, event: Touch) -> None:
    check_time(s, event.time)
    nodes = s.nodes
    for node_id in event.nodes:
        if node_id not in nodes:
            raise Reject(f"unknown tree node {node_id}")
    time = event.time
    for node_id in event.nodes:
        s.node_w(node_id).last_access = time
    s.clock = time
    if s.touched is not None:
        s.touched.stamped.update(event.nodes)


@rule(Lock)
def lock(s: Any, event: Lock) -> None:
    _node(s, event.node)
    moved = 0
    leaves = s.leaves
    node_id = event.node
    path = []
    while node_id != ROOT:
        node = s.node_w(node_id)
        if node.lock_ref == 0:
            moved += len(node.key)
            if node_id in leaves:
                del leaves[node_id]
        node.lock_ref += 1
        path.append(node_id)
        node_id = node.parent
        if node_id != ROOT:
            s.node_w(node_id).below += 1
    s.evictable_size -= moved
    s.protected_size += moved
    if s.touched is not None:
        s.touched.locked.update(path)


@rule(Unlock)
def unlock(s: Any, event: Unlock) -> None:
    target = _node(s, event.node)
    if event.node == ROOT:
        return
    if target.lock_ref == 0:
        raise Reject(f"unlock of node {event.node} below zero (lock_ref is 0)")
    if target.lock_ref - target.below <= 0:
        raise Reject(f"node {event.node} holds no lock of its own "
                     f"(lock_ref {target.lock_ref}, {target.below} from its children)")
    nodes = s.nodes
    path = []
    node_id = event.node
    while node_id != ROOT:
        node = nodes[node_id]
        if node.lock_ref == 0:
            raise Reject(f"unlock of node {node_id} below zero (lock_ref is 0)")
        if node.swa is not None and node.lock_ref <= node.swa.lock_ref:
            raise Reject(f"node {node_id} still has {node.swa.lock_ref} SWA window lock(s) under "
                         "its FULL lock; release the SWA lock first")
        refuse_unlock(s, node_id, node)
        path.append(node_id)
        node_id = node.parent
    moved = 0
    freed_leaf = None
    for node_id in path:
        node = s.node_w(node_id)
        if node.lock_ref == 1:
            moved += len(node.key)
            if not node.children:
                freed_leaf = node_id
        node.lock_ref -= 1
        if node.parent != ROOT:
            s.node_w(node.parent).below -= 1
    if freed_leaf is not None:
        s.leaves[freed_leaf] = None
    s.evictable_size += moved
    s.protected_size -= moved
    if s.touched is not None:
        s.touched.locked.update(path)


@rule(Evict)
def evict(s: Any, event: Evict) -> None:
    order = event.nodes
    check_distinct(order, "node")
    nodes, tree_refs, host = s.nodes, s.tree_refs, s.host
    left: dict[int, int] = {}  # children still attached, for parents that lost one here
    gone: set[int] = set()
    for node_id in order:
        if node_id == ROOT:
            raise Reject("cannot evict the root")
        node = nodes.get(node_id)
        if node is None or node_id in gone:
            raise Reject(f"unknown tree node {node_id}")
        if node.lock_ref > 0:
            raise Reject(f"node {node_id} is locked (lock_ref {node.lock_ref})")
        if node.swa is not None and node.swa.live:
            raise Reject(f"node {node_id} still holds SWA KV; tombstone it first (SwaEvict)")
        refuse_evict(s, node_id)
        children = left.get(node_id, len(node.children))
        if children > 0:
            raise Reject(f"node {node_id} is not a leaf ({children} children)")
        mapped = [p for p in node.pages if p in tree_refs]
        if mapped:
            raise Reject(f"node {node_id} page {mapped[0]} is still mapped by a request "
                         "(evicting it would be a use after free)")
        if host is not None and node_id not in host.backup and _has_host_children(host, node_id):
            raise Reject(f"node {node_id} has host-only children but no host copy")
        gone.add(node_id)
        if node.parent != ROOT:
            left[node.parent] = left.get(node.parent, len(nodes[node.parent].children)) - 1
    child_key = s.geometry.child_key
    page_node, holders, leaves = s.page_node, s.holders, s.leaves
    evicted_tokens = 0
    for node_id in order:
        node = nodes[node_id]
        parent = s.node_w(node.parent)
        del parent.children[child_key(node.key)]
        s.drop_node(node_id)
        if node_id in leaves:
            del leaves[node_id]
        if node.parent != ROOT and parent.lock_ref == 0 and not parent.children:
            leaves[node.parent] = None
        released = [page for page in node.pages if page not in holders]
        for page in node.pages:
            del page_node[page]
        s.free_pages = (s.free_pages.push_head(released) if event.at_head
                        else s.free_pages.push_tail(released))
        evicted_tokens += len(node.key)
        if host is not None and node_id in host.backup:
            host.evicted[node_id] = HostNode(node.parent, node.key, node.last_access)
            host.evicted_children[(node.parent, child_key(node.key))] = node_id
        if s.touched is not None:
            s.touched.pages.update(node.pages)
            s.touched.nodes.update((node_id, node.parent))
    s.evictable_size -= evicted_tokens


def _has_host_children(host: Any, node_id: int) -> bool:
    return any(parent == node_id for parent, _ in host.snapshot("evicted_children").keys())
