"""The model's rules for the radix tree: insert, split, touch, lock, unlock, evict, reset.

Written from docs/design.md and the event docstrings.  With a host tier the
tree events follow it as ``kvstate.events.host`` describes: an insert is
refused where a host-only node already starts with the key, a split splits
a node's host copy with it, an evicted backed-up node stays as host-only,
and a tree reset empties the tier.  Decisions (specs/SPEC.md):

* ``Unlock(n)`` releases a lock taken by ``Lock(n)``: ``n`` must hold a lock
  of its own (``lock_ref(n)`` minus its children's);
* a tree page a request maps without holding it stays in the tree while the
  request is open: ``Evict`` and ``Reset("tree")`` refuse to drop it;
* a node without a host copy cannot be evicted while host-only children hang
  off it (they would lose their parent).
"""

from __future__ import annotations

from typing import Any

from specs.model_radix import close, referenced_tree_pages
from specs.model_state import (
    ROOT,
    MNode,
    ModelHost,
    ModelState,
    distinct,
    no_earlier_than_clock,
    push,
    require,
    valid_page,
)


def host_only_children(m: ModelState, node_id: int) -> list[int]:
    if m.host is None:
        return []
    return sorted(n for n, (parent, _, _) in m.host.host_only.items() if parent == node_id)


def insert(m: ModelState, e: Any) -> None:
    size = m.page_size
    require(e.parent in m.nodes, f"unknown parent {e.parent}")
    require(e.node == m.next_node, f"node id must be {m.next_node}")
    no_earlier_than_clock(m, e.time)
    require(len(e.key) > 0 and len(e.key) == len(e.slots), "key and value lengths")
    require(len(e.key) % size == 0, "key is not whole pages")
    first = m.child_key(e.key)
    require(all(m.child_key(m.nodes[c].key) != first for c in m.children(e.parent)),
            "parent already has a child with that first page")
    require(all(m.child_key(m.host.host_only[c][1]) != first   # type: ignore[union-attr]
                for c in host_only_children(m, e.parent)),
            "a host-only node already starts with this key: load it back first")
    pages = []
    for index in range(0, len(e.slots), size):
        page = e.slots[index] // size
        require(list(e.slots[index:index + size]) == [page * size + k for k in range(size)],
                "value is not whole pages")
        pages.append(page)
    distinct(pages, "page")
    owner = m.tree_page_owner()
    for page in pages:
        valid_page(m, page)
        require(page not in owner, f"page {page} already in the tree")
        require(e.owner in m.holders.get(page, ()), f"page {page} not held by {e.owner!r}")
    for page in pages:
        m.holders[page].discard(e.owner)
        if not m.holders[page]:
            del m.holders[page]
    m.nodes[e.node] = MNode(e.parent, tuple(e.key), pages, 0, e.time)
    m.next_node, m.clock = e.node + 1, e.time


def split(m: ModelState, e: Any) -> None:
    size = m.page_size
    require(e.node != ROOT and e.node in m.nodes, f"cannot split node {e.node}")
    require(e.new_node == m.next_node, f"node id must be {m.next_node}")
    no_earlier_than_clock(m, e.time)
    node = m.nodes[e.node]
    require(0 < e.at < len(node.key) and e.at % size == 0, f"bad split point {e.at}")
    cut = e.at // size
    m.nodes[e.new_node] = MNode(node.parent, node.key[:e.at], node.pages[:cut], node.lock_ref, e.time)
    m.nodes[e.node] = MNode(e.new_node, node.key[e.at:], node.pages[cut:], node.lock_ref,
                            node.last_access)
    if m.host is not None and e.node in m.host.backup:  # the host copy splits with the node
        copy = m.host.backup[e.node]
        m.host.backup[e.new_node], m.host.backup[e.node] = copy[:cut], copy[cut:]
    m.next_node, m.clock = e.new_node + 1, e.time


def touch(m: ModelState, e: Any) -> None:
    no_earlier_than_clock(m, e.time)
    for node_id in e.nodes:
        require(node_id in m.nodes, f"unknown node {node_id}")
    for node_id in e.nodes:
        m.nodes[node_id].last_access = e.time
    m.clock = e.time


def lock(m: ModelState, e: Any) -> None:
    require(e.node in m.nodes, f"unknown node {e.node}")
    for node_id in m.path(e.node):
        m.nodes[node_id].lock_ref += 1


def unlock(m: ModelState, e: Any) -> None:
    require(e.node in m.nodes, f"unknown node {e.node}")
    if e.node == ROOT:
        return  # like Lock(ROOT): the root is locked once, forever; nothing moves
    below = sum(m.nodes[c].lock_ref for c in m.children(e.node))
    require(m.nodes[e.node].lock_ref - below > 0,
            f"node {e.node} holds no lock of its own (its locks belong to its descendants)")
    for node_id in m.path(e.node):
        require(m.nodes[node_id].lock_ref > 0, f"unlock of node {node_id} below zero")
        m.nodes[node_id].lock_ref -= 1


def evict(m: ModelState, e: Any) -> None:
    distinct(e.nodes, "node")
    referenced = referenced_tree_pages(m)
    for node_id in e.nodes:
        require(node_id != ROOT and node_id in m.nodes, f"cannot evict node {node_id}")
        node = m.nodes[node_id]
        require(node.lock_ref == 0, f"node {node_id} is locked")
        require(not m.children(node_id), f"node {node_id} is not a leaf")
        require(not referenced & set(node.pages), f"node {node_id} pages are mapped by a request")
        backed_up = m.host is not None and node_id in m.host.backup
        require(backed_up or not host_only_children(m, node_id),
                f"node {node_id} has host-only children but no host copy")
        del m.nodes[node_id]
        if backed_up:
            m.host.host_only[node_id] = (node.parent, node.key, node.last_access)  # type: ignore[union-attr]
        released = [p for p in node.pages if p not in m.holders]
        m.free = push(m.free, released, e.at_head)


def reset(m: ModelState, e: Any) -> None:
    require(e.scope in ("tree", "rows", "pages", "all"), f"unknown reset scope {e.scope!r}")
    if m.mode == "block":
        require(e.scope in ("rows", "pages"), "block mode clears its prefix tree with BlockClear")
    if e.scope in ("rows", "all"):
        close(m, list(m.requests))
        m.free_rows = list(range(m.num_rows, 0, -1))
    if e.scope in ("tree", "all"):
        require(not referenced_tree_pages(m), "a request still maps tree pages it does not hold")
        owner = m.tree_page_owner()
        m.free = m.free + sorted(p for p in owner if p not in m.holders)
        root = m.nodes[ROOT]
        m.nodes = {ROOT: MNode(-1, (), [], 1, root.last_access)}
        if m.host is not None:
            m.host = ModelHost(m.host.num_pages, list(range(m.host.num_pages)))
    if e.scope in ("pages", "all"):
        require(len(m.nodes) == 1, "the tree still holds pages")
        require(not m.requests, "requests are still open")
        m.free = list(range(1, m.num_pages + 1))
        m.holders = {}
        m.pool = {}
