"""The model's host-tier rules: offload (back a node up), load (bring a host-only node
back), host free (drop host copies).

Written from ``kvstate.events.host`` and the host invariants (specs/SPEC.md
H1-H3): a host page is free or owned by one backed-up node; backed-up nodes
are root-closed (a backed-up node's parent is the root or backed up); a
host-only node keeps its key and hangs off a live parent (on the device or
host-only itself), and no device node shares its key.  How the tree events
follow the tier is in ``specs.model_tree``.
"""

from __future__ import annotations

from typing import Any

from specs.model_state import (
    ROOT,
    MNode,
    ModelHost,
    ModelState,
    distinct,
    no_earlier_than_clock,
    push,
    require,
)


def _tier(m: ModelState, e: Any) -> ModelHost:
    require(m.host is not None, f"{type(e).__name__} needs a host tier")
    assert m.host is not None
    return m.host


def offload(m: ModelState, e: Any) -> None:
    host = _tier(m, e)
    require(e.node != ROOT and e.node in m.nodes, f"node {e.node} is not a device tree node")
    require(e.node not in host.backup, f"node {e.node} is already backed up")
    node = m.nodes[e.node]
    require(node.parent == ROOT or node.parent in host.backup,
            f"parent {node.parent} is not backed up (backups are root-closed)")
    require(len(e.host_pages) == len(node.pages), "one host page per device page")
    distinct(e.host_pages, "host page")
    for page in e.host_pages:
        require(page in host.free, f"host page {page} is not a free host page")
    for page in e.host_pages:
        host.free.remove(page)
    host.backup[e.node] = list(e.host_pages)


def load(m: ModelState, e: Any) -> None:
    host = _tier(m, e)
    require(e.node in host.host_only, f"node {e.node} is not a host-only node")
    no_earlier_than_clock(m, e.time)
    parent, key, _ = host.host_only[e.node]
    require(parent in m.nodes, f"parent {parent} is not on the device: load it first")
    first = m.child_key(key)
    require(all(m.child_key(m.nodes[c].key) != first for c in m.children(parent)),
            "a device node already starts with this key")
    require(len(e.pages) * m.page_size == len(key), "one free device page per page of the key")
    distinct(e.pages, "page")
    for page in e.pages:
        require(page in m.free, f"page {page} is not free")
    for page in e.pages:
        m.free.remove(page)
    m.nodes[e.node] = MNode(parent, key, list(e.pages), 0, e.time)
    del host.host_only[e.node]
    m.clock = e.time


def host_free(m: ModelState, e: Any) -> None:
    """Drop host copies in order; a host-only node leaves the tree with its copy."""
    host = _tier(m, e)
    distinct(e.nodes, "node")
    for node_id in e.nodes:
        require(node_id in host.backup, f"node {node_id} has no host copy")
        # Root-closed backups: nothing backed up (on the device or host-only) may stay below it.
        below = [n for n in host.backup if n != node_id and _parent(m, n) == node_id]
        require(not below, f"node {node_id} still has backed-up children {below}")
        host.free = push(host.free, host.backup.pop(node_id), e.at_head)
        host.host_only.pop(node_id, None)


def _parent(m: ModelState, node_id: int) -> int:
    if node_id in m.nodes:
        return m.nodes[node_id].parent
    assert m.host is not None
    return m.host.host_only[node_id][0]
