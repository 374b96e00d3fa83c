"""Rules of the host tier: offload (back a node up), load (bring a host-only node back),
host free (drop host copies).

How core events follow the tier lives with their own rules: ``Insert`` is
refused under a host-only child with the same key, ``Split`` splits a node's
host pages with it, ``Evict`` of a backed-up node leaves it host-only, and a
tree reset empties the tier.  Invariants kept (``kvstate.invariants.host``):
a host page is owned by at most one node; backed-up nodes form a root-closed
set; a host-only node keeps its key and hangs off a live parent.
"""

from __future__ import annotations

from typing import Any

from kvstate.events import Event, HostFree, Load, Offload
from kvstate.records import MNode
from kvstate.rules.common import check_distinct, check_time
from kvstate.rules.registry import Reject, rule
from kvstate.state import ROOT


def _host(s: Any, event: Event) -> Any:
    if s.host is None:
        raise Reject(f"{type(event).__name__} needs a host tier "
                     "(a state built with initial_state(geometry, host_pages=N))")
    return s.host


@rule(Offload)
def offload(s: Any, event: Offload) -> None:
    host = _host(s, event)
    node = s.nodes.get(event.node)
    if node is None or event.node == ROOT:
        raise Reject(f"node {event.node} is not a device tree node")
    if event.node in host.backup:
        raise Reject(f"node {event.node} is already backed up")
    if node.parent != ROOT and node.parent not in host.backup:
        raise Reject(f"parent {node.parent} of node {event.node} is not backed up "
                     "(backed-up nodes must form a root-closed prefix)")
    if len(event.host_pages) != len(node.pages):
        raise Reject(f"node {event.node} has {len(node.pages)} pages, got "
                     f"{len(event.host_pages)} host pages")
    check_distinct(event.host_pages, "host page")
    for page in event.host_pages:
        if not 0 <= page < host.num_pages:
            raise Reject(f"host page {page} is outside 0..{host.num_pages - 1}")
        if page not in host.free_pages:
            raise Reject(f"host page {page} is owned by node {host.owner.get(page)}")
    for page in event.host_pages:
        host.owner[page] = event.node
    host.free_pages = host.free_pages.take(event.host_pages)
    host.backup[event.node] = tuple(event.host_pages)
    if s.touched is not None:
        s.touched.host_nodes.add(event.node)


@rule(Load)
def load(s: Any, event: Load) -> None:
    host = _host(s, event)
    record = host.evicted.get(event.node)
    if record is None:
        raise Reject(f"node {event.node} is not a host-only node")
    check_time(s, event.time)
    parent = s.nodes.get(record.parent)
    if parent is None:
        raise Reject(f"parent {record.parent} of node {event.node} is not on the device; "
                     "load the parent first")
    child_key = s.geometry.child_key(record.key)
    if child_key in parent.children:
        raise Reject(f"device node {parent.children[child_key]} already starts with this key")
    if len(event.pages) * s.geometry.page_size != len(record.key):
        raise Reject(f"node {event.node} needs {len(record.key) // s.geometry.page_size} pages, "
                     f"got {len(event.pages)}")
    check_distinct(event.pages, "page")
    for page in event.pages:
        if page not in s.free_pages:
            raise Reject(f"page {page} is not free")
    s.add_node(event.node, MNode(record.parent, record.key, tuple(event.pages), s.new_children(),
                                 0, event.time))
    s.node_w(record.parent).children[child_key] = event.node
    page_node = s.page_node
    for page in event.pages:
        page_node[page] = event.node
    s.free_pages = s.free_pages.take(event.pages)
    s.clock = event.time
    s.evictable_size += len(record.key)
    leaves = s.leaves  # the loaded node is an unlocked leaf; its parent no longer is
    if record.parent in leaves:
        del leaves[record.parent]
    leaves[event.node] = None
    del host.evicted[event.node]
    del host.evicted_children[(record.parent, child_key)]
    if s.touched is not None:
        s.touched.pages.update(event.pages)
        s.touched.nodes.update((event.node, record.parent))
        s.touched.host_nodes.add(event.node)


@rule(HostFree)
def host_free(s: Any, event: HostFree) -> None:
    host = _host(s, event)
    check_distinct(event.nodes, "node")
    dropped: set[int] = set()  # the nodes this event frees before the one being checked
    for node_id in event.nodes:
        if host.backup.get(node_id) is None or node_id in dropped:
            raise Reject(f"node {node_id} has no host copy")
        hidden = [n for (parent, _), n in host.snapshot("evicted_children").items()
                  if parent == node_id and n not in dropped]
        if hidden:
            raise Reject(f"node {node_id} still has host-only children")
        device = s.nodes.get(node_id)
        if device is not None and any(c in host.backup and c not in dropped
                                      for c in device.children.values()):
            raise Reject(f"node {node_id} has backed-up children (root-closed backups)")
        dropped.add(node_id)
    child_key = s.geometry.child_key
    for node_id in event.nodes:
        pages = host.backup[node_id]
        for page in pages:
            del host.owner[page]
        record = host.evicted.get(node_id)
        if record is not None:
            del host.evicted[node_id]
            del host.evicted_children[(record.parent, child_key(record.key))]
        host.free_pages = (host.free_pages.push_head(pages) if event.at_head
                           else host.free_pages.push_tail(pages))
        del host.backup[node_id]
    if s.touched is not None:
        s.touched.host_nodes.update(event.nodes)
