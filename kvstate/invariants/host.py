"""Named invariants of the host tier (checked when a state has one).

The three properties of a state's host tier, each recomputed from scratch
(pure, read-only), under stable names that ``specs/SPEC.md`` (H1-H3),
replay failures and the canaries use:

* ``host_owned_once``: every host page is free or owned by exactly one
  backed-up node, and the owner index says the same;
* ``host_root_closed``: backed-up nodes form a root-closed set (a backed-up
  node's parent is the root or backed up too), each is on the device or
  host-only but not both, and a device node's copy covers its whole key;
* ``host_only_keeps_key``: a host-only node (device copy evicted) keeps its
  key, its host copy and its place under a live parent, so a later match can
  still find it and load it back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvstate.invariants.registry import named
from kvstate.state import ROOT


@named("host_owned_once", host=True)
def _owned_once(state: Any) -> Iterator[str]:
    host = state.host
    if host is None:
        return
    seen: dict[int, int] = {}
    for node_id, pages in host.backup.items():
        for page in pages:
            if page in seen:
                yield f"host page {page} is owned by nodes {seen[page]} and {node_id}"
            seen[page] = node_id
            if host.owner.get(page) != node_id:
                yield f"host page {page} of node {node_id} has owner {host.owner.get(page)}"
            if page in host.free_pages:
                yield f"host page {page} of node {node_id} is also free"
    if len(seen) + len(host.free_pages) != host.num_pages or len(host.owner) != len(seen):
        yield "host pages are not partitioned into free and owned"


@named("host_root_closed", host=True)
def _root_closed(state: Any) -> Iterator[str]:
    core, host = state, state.host
    if host is None:
        return
    size = core.geometry.page_size
    for node_id, pages in host.backup.items():
        device = core.nodes.get(node_id)
        record = host.evicted.get(node_id)
        if (device is None) == (record is None):
            yield f"backed-up node {node_id} must be exactly one of device and host-only"
            continue
        parent = device.parent if device is not None else record.parent  # type: ignore[union-attr]
        if parent != ROOT and parent not in host.backup:
            yield f"backed-up node {node_id} has parent {parent} without a host copy"
        if device is not None and len(pages) * size != len(device.key):
            yield f"node {node_id}: {len(pages)} host pages for {len(device.key)} tokens"


@named("host_only_keeps_key", host=True)
def _keeps_key(state: Any) -> Iterator[str]:
    core, host = state, state.host
    if host is None:
        return
    size = core.geometry.page_size
    for node_id, record in host.evicted.items():
        if node_id in core.nodes:
            yield f"host-only node {node_id} is also in the device tree"
        if not record.key:
            yield f"host-only node {node_id} lost its key"
            continue
        pages = host.backup.get(node_id)
        if pages is None:
            yield f"host-only node {node_id} has no host copy"
        elif len(pages) * size != len(record.key):
            yield f"host-only node {node_id}: {len(pages)} host pages for {len(record.key)} tokens"
        if record.parent != ROOT and record.parent not in core.nodes and record.parent not in host.evicted:
            yield f"host-only node {node_id} hangs off missing parent {record.parent}"
        child_key = core.geometry.child_key(record.key)
        if host.evicted_children.get((record.parent, child_key)) != node_id:
            yield f"host-only node {node_id} is not indexed under its parent"
        parent = core.nodes.get(record.parent)
        if parent is not None and child_key in parent.children:
            yield f"host-only node {node_id} and device node {parent.children[child_key]} share a key"
    if len(host.evicted_children) != len(host.evicted):
        yield "the host-only child index has stale entries"
