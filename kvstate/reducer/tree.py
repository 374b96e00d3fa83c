"""Reducer rules for the radix tree: insert, split, touch, lock, unlock, evict.

Sizes: a node's tokens count as ``protected`` while its ``lock_ref > 0`` and
as ``evictable`` otherwise; the root (id 0, empty key) is locked once, forever,
and lock walks never touch it.  A split keeps the *bottom* half under the old
node id, so a handle taken before the split still covers the whole prefix::

    before:  parent -> node[key a+b]
    after:   parent -> new_node[key a] -> node[key b]
"""

from __future__ import annotations

from typing import Any

from immutables import Map

from kvstate.events import Evict, Insert, Lock, Split, Touch, Unlock
from kvstate.reducer import Reject, handles
from kvstate.reducer.common import adjust_tree_refs, check_distinct, check_page_id, check_time
from kvstate.state import DETACHED, ROOT, Node, State, expand_pages


def _node(state: State, node_id: int) -> Node:
    node = state.nodes.get(node_id)
    if node is None:
        raise Reject(f"unknown tree node {node_id}")
    return node


def _check_fresh(state: State, node_id: int) -> None:
    if node_id != state.next_node_id:
        raise Reject(f"new node id must be {state.next_node_id}, got {node_id}")


@handles(Insert)
def insert(state: State, event: Insert) -> State:
    parent = _node(state, event.parent)
    key, slots, size = event.key, event.slots, state.geometry.page_size
    _check_fresh(state, event.node)
    check_time(state, event.time)
    if not key:
        raise Reject("insert of an empty key")
    if len(slots) != len(key):
        raise Reject(f"value length {len(slots)} differs from key length {len(key)}")
    if len(key) % size:
        raise Reject(f"key length {len(key)} is not a multiple of page size {size}")
    child_key = state.geometry.child_key(key)
    if child_key in parent.children:
        raise Reject(f"node {event.parent} already has a child starting with {child_key!r}")
    pages = [slot // size for slot in slots[::size]]
    if expand_pages(pages, size) != slots:
        raise Reject(f"slots {list(slots[:8])}... are not whole pages in order")
    check_distinct(pages, "page")
    holders = state.holders
    for page in pages:
        check_page_id(state, page)
        if page in state.page_node:
            raise Reject(f"page {page} is already in tree node {state.page_node[page]}")
        if event.owner not in holders.get(page, ()):
            raise Reject(f"page {page} is not held by owner {event.owner!r}")
    with holders.mutate() as out_holders, state.page_node.mutate() as out_nodes:
        for page in pages:
            rest = tuple(h for h in out_holders[page] if h != event.owner)
            if rest:
                out_holders[page] = rest
            else:
                del out_holders[page]
            out_nodes[page] = event.node
        holders, page_node = out_holders.finish(), out_nodes.finish()
    leaf = Node(parent=event.parent, key=key, pages=tuple(pages), children=Map(),
                lock_ref=0, last_access=event.time)
    new_parent = _evolve(parent, children=parent.children.set(child_key, event.node))
    nodes = state.nodes.update({event.parent: new_parent, event.node: leaf})
    leaves = state.leaves
    if event.parent in leaves:
        leaves = leaves.delete(event.parent)
    tree_refs = state.tree_refs
    if event.owner != DETACHED and event.owner in state.requests:
        # The owner keeps mapping the pages; its hold moved to the tree.
        tree_refs = adjust_tree_refs(tree_refs, pages, +1)
    return state.with_changes(nodes=nodes, holders=holders, page_node=page_node, tree_refs=tree_refs,
                              next_node_id=event.node + 1, clock=event.time,
                              evictable_size=state.evictable_size + len(key),
                              leaves=leaves.set(event.node, None))


@handles(Split)
def split(state: State, event: Split) -> State:
    if event.node == ROOT:
        raise Reject("cannot split the root")
    node = _node(state, event.node)
    _check_fresh(state, event.new_node)
    check_time(state, event.time)
    at, size = event.at, state.geometry.page_size
    if at <= 0:
        raise Reject(f"split at {at}: must be inside the key")
    if at >= len(node.key):
        raise Reject(f"split at {at} is at or beyond the key length {len(node.key)}")
    if at % size:
        raise Reject(f"split at {at} is off a page boundary (page size {size})")
    geometry = state.geometry
    top_pages = node.pages[: at // size]
    top = Node(parent=node.parent, key=node.key[:at], pages=top_pages,
               children=Map({geometry.child_key(node.key[at:]): event.node}),
               lock_ref=node.lock_ref, last_access=event.time)
    bottom = _evolve(node, parent=event.new_node, key=node.key[at:],
                     pages=node.pages[at // size:])
    parent = state.nodes[node.parent]
    new_parent = _evolve(parent, children=parent.children.set(geometry.child_key(node.key),
                                                              event.new_node))
    with state.page_node.mutate() as out:
        for page in top_pages:
            out[page] = event.new_node
        page_node = out.finish()
    nodes = state.nodes.update({node.parent: new_parent, event.new_node: top,
                                event.node: bottom})
    return state.with_changes(nodes=nodes, page_node=page_node,
                              next_node_id=event.new_node + 1, clock=event.time)


@handles(Touch)
def touch(state: State, event: Touch) -> State:
    check_time(state, event.time)
    with state.nodes.mutate() as out:
        for node_id in event.nodes:
            node = out.get(node_id)
            if node is None:
                raise Reject(f"unknown tree node {node_id}")
            out[node_id] = _evolve(node, last_access=event.time)
        nodes = out.finish()
    return state.with_changes(nodes=nodes, clock=event.time)


@handles(Lock)
def lock(state: State, event: Lock) -> State:
    _node(state, event.node)
    moved = 0
    leaves = state.leaves
    with state.nodes.mutate() as out:
        for node_id in state.path_to_root(event.node):
            node = out[node_id]
            if node.lock_ref == 0:
                moved += len(node.key)
                if node_id in leaves:
                    leaves = leaves.delete(node_id)
            out[node_id] = _evolve(node, lock_ref=node.lock_ref + 1)
        nodes = out.finish()
    return state.with_changes(nodes=nodes, evictable_size=state.evictable_size - moved,
                              protected_size=state.protected_size + moved, leaves=leaves)


@handles(Unlock)
def unlock(state: State, event: Unlock) -> State:
    target = _node(state, event.node)
    if event.node != ROOT and target.lock_ref == 0:
        raise Reject(f"unlock of node {event.node} below zero (lock_ref is 0)")
    if event.node != ROOT:
        below = sum(state.nodes[child].lock_ref for child in target.children.values())
        if target.lock_ref - below <= 0:
            raise Reject(f"node {event.node} holds no lock of its own "
                         f"(lock_ref {target.lock_ref}, {below} from its children)")
    moved = 0
    freed_leaf: int | None = None
    with state.nodes.mutate() as out:
        for node_id in state.path_to_root(event.node):
            node = out[node_id]
            if node.lock_ref == 0:
                raise Reject(f"unlock of node {node_id} below zero (lock_ref is 0)")
            if node.lock_ref == 1:
                moved += len(node.key)
                if not node.children:
                    freed_leaf = node_id
            out[node_id] = _evolve(node, lock_ref=node.lock_ref - 1)
        nodes = out.finish()
    leaves = state.leaves if freed_leaf is None else state.leaves.set(freed_leaf, None)
    return state.with_changes(nodes=nodes, evictable_size=state.evictable_size + moved,
                              protected_size=state.protected_size - moved, leaves=leaves)


@handles(Evict)
def evict(state: State, event: Evict) -> State:
    check_distinct(event.nodes, "node")
    nodes, page_node, holders = state.nodes, state.page_node, state.holders
    queue = state.free_pages
    leaves = state.leaves
    evicted_tokens = 0
    for node_id in event.nodes:
        if node_id == ROOT:
            raise Reject("cannot evict the root")
        node = nodes.get(node_id)
        if node is None:
            raise Reject(f"unknown tree node {node_id}")
        if node.lock_ref > 0:
            raise Reject(f"node {node_id} is locked (lock_ref {node.lock_ref})")
        if len(node.children) > 0:
            raise Reject(f"node {node_id} is not a leaf ({len(node.children)} children)")
        mapped = [p for p in node.pages if p in state.tree_refs]
        if mapped:
            raise Reject(f"node {node_id} page {mapped[0]} is still mapped by a request "
                         "(evicting it would be a use after free)")
        parent = nodes[node.parent]
        child_key = state.geometry.child_key(node.key)
        parent = _evolve(parent, children=parent.children.delete(child_key))
        nodes = nodes.delete(node_id).set(node.parent, parent)
        if node_id in leaves:
            leaves = leaves.delete(node_id)
        if node.parent != ROOT and parent.lock_ref == 0 and not parent.children:
            leaves = leaves.set(node.parent, None)
        released = [page for page in node.pages if page not in holders]
        with page_node.mutate() as out:
            for page in node.pages:
                del out[page]
            page_node = out.finish()
        queue = queue.push_head(released) if event.at_head else queue.push_tail(released)
        evicted_tokens += len(node.key)
    return state.with_changes(nodes=nodes, page_node=page_node, free_pages=queue,
                              evictable_size=state.evictable_size - evicted_tokens, leaves=leaves)


def _evolve(node: Node, **changes: Any) -> Node:
    return node._replace(**changes)
