"""Transient rules for the radix tree (mirrors ``kvstate.reducer.tree``).

Same contract as ``kvstate.transient.pages``: check everything, then mutate;
``False`` leaves ``ts`` untouched.  A split keeps the bottom half under the
old node id::

    before:  parent -> node[key a+b]
    after:   parent -> new_node[key a] -> node[key b]
"""

from __future__ import annotations

from kvstate.events import Evict, Insert, Lock, Split, Touch, Unlock
from kvstate.reducer.common import bump_counts
from kvstate.state import DETACHED, ROOT, expand_pages
from kvstate.transient.state import TNode, TransientState


def insert(ts: TransientState, event: Insert) -> bool:
    parent = ts.nodes.get(event.parent)
    key, slots, size = event.key, event.slots, ts.geometry.page_size
    if (parent is None or event.node != ts.next_node_id or event.time < ts.clock or not key
            or len(slots) != len(key) or len(key) % size):
        return False
    child_key = ts.geometry.child_key(key)
    if child_key in parent.children:
        return False
    pages = [slot // size for slot in slots[::size]]
    if expand_pages(pages, size) != slots or len(set(pages)) != len(pages):
        return False
    holders, page_node, owner = ts.holders, ts.page_node, event.owner
    num_pages = ts.geometry.num_pages
    for page in pages:
        if not 1 <= page <= num_pages or page in page_node or owner not in holders.get(page, ()):
            return False
    for page in pages:
        rest = () if len(holders[page]) == 1 else tuple(h for h in holders[page] if h != owner)
        if rest:
            holders[page] = rest
        else:  # the owner was the only holder (the usual case: no tuple to build)
            del holders[page]
        page_node[page] = event.node
    ts.nodes[event.node] = TNode(event.parent, key, tuple(pages), {}, 0, event.time)
    parent.children[child_key] = event.node
    parent.frozen = None
    ts.leaves.pop(event.parent, None)
    if owner != DETACHED and owner in ts.requests:
        # the owner keeps mapping the pages; its hold moved to the tree
        bump_counts(ts.tree_refs, pages, +1)
    ts.next_node_id = event.node + 1
    ts.clock = event.time
    ts.evictable_size += len(key)
    ts.leaves[event.node] = None
    return True


def split(ts: TransientState, event: Split) -> bool:
    node = ts.nodes.get(event.node)
    at, size = event.at, ts.geometry.page_size
    if (event.node == ROOT or node is None or event.new_node != ts.next_node_id
            or event.time < ts.clock or at <= 0 or at >= len(node.key) or at % size):
        return False
    key, cut = node.key, at // size
    top = TNode(node.parent, key[:at], node.pages[:cut], {ts.geometry.child_key(key[at:]): event.node},
                node.lock_ref, event.time, None, node.lock_ref)
    parent = ts.nodes[node.parent]
    parent.children[ts.geometry.child_key(key)] = event.new_node
    parent.frozen = node.frozen = None
    page_node = ts.page_node
    for page in top.pages:
        page_node[page] = event.new_node
    node.parent, node.key, node.pages = event.new_node, key[at:], node.pages[cut:]
    ts.nodes[event.new_node] = top
    ts.next_node_id = event.new_node + 1
    ts.clock = event.time
    return True


def touch(ts: TransientState, event: Touch) -> bool:
    nodes = ts.nodes
    if event.time < ts.clock or any(node_id not in nodes for node_id in event.nodes):
        return False
    time = event.time
    for node_id in event.nodes:
        node = nodes[node_id]
        node.last_access = time
        node.frozen = None
    ts.clock = time
    return True


def lock(ts: TransientState, event: Lock) -> bool:
    nodes = ts.nodes
    node_id = event.node
    if node_id not in nodes:
        return False
    moved = 0
    leaves = ts.leaves
    while node_id != ROOT:
        node = nodes[node_id]
        if node.lock_ref == 0:
            moved += len(node.key)
            leaves.pop(node_id, None)
        node.lock_ref += 1
        node.frozen = None
        node_id = node.parent
        nodes[node_id].below += 1
    ts.evictable_size -= moved
    ts.protected_size += moved
    return True


def unlock(ts: TransientState, event: Unlock) -> bool:
    nodes = ts.nodes
    target = nodes.get(event.node)
    if target is None:
        return False
    if event.node != ROOT and target.lock_ref - target.below <= 0:
        return False  # no lock of its own (this also covers lock_ref == 0)
    path = []
    node_id = event.node
    while node_id != ROOT:
        node = nodes[node_id]
        if node.lock_ref == 0:
            return False
        path.append((node_id, node))
        node_id = node.parent
    moved = 0
    freed_leaf = None
    for node_id, node in path:
        if node.lock_ref == 1:
            moved += len(node.key)
            if not node.children:
                freed_leaf = node_id
        node.lock_ref -= 1
        node.frozen = None
        nodes[node.parent].below -= 1
    if freed_leaf is not None:
        ts.leaves[freed_leaf] = None
    ts.evictable_size += moved
    ts.protected_size -= moved
    return True


def evict(ts: TransientState, event: Evict) -> bool:
    nodes, tree_refs = ts.nodes, ts.tree_refs
    order = event.nodes
    if len(set(order)) != len(order):
        return False
    gone: set[int] = set()  # a parent may follow its last child in the same event
    for node_id in order:
        node = nodes.get(node_id)
        if node_id == ROOT or node is None or node.lock_ref > 0:
            return False
        if node.children and any(child not in gone for child in node.children.values()):
            return False
        if any(page in tree_refs for page in node.pages):
            return False
        gone.add(node_id)
    page_node, holders, leaves = ts.page_node, ts.holders, ts.leaves
    queue = ts.free_pages
    evicted_tokens = 0
    for node_id in order:
        node = nodes.pop(node_id)
        parent = nodes[node.parent]
        del parent.children[ts.geometry.child_key(node.key)]
        parent.frozen = None
        leaves.pop(node_id, None)
        if node.parent != ROOT and parent.lock_ref == 0 and not parent.children:
            leaves[node.parent] = None
        released = [page for page in node.pages if page not in holders]
        for page in node.pages:
            del page_node[page]
        if event.at_head:
            queue.push_head(released)
        else:
            queue.push_tail(released)
        evicted_tokens += len(node.key)
    ts.evictable_size -= evicted_tokens
    return True
