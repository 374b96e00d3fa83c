"""Integrity mode across the host tier: host copies read back their nodes' tags.

A helper of :class:`~kvstate.executor.integrity.IntegrityMonitor`: it reads
the monitor's ``node_content`` and the executor's host pool, and mutates
nothing but the ``problems`` list it is given.
"""

from __future__ import annotations

from typing import Any

import torch

from kvstate.executor.integrity_block import Content
from kvstate.executor.integrity_tags import TagRows
from kvstate.state import State, expand_pages


def verify_host(monitor: Any, state: State, problems: list[str]) -> int:
    """Every backed-up node's host pages read back the node's tags (all layers); rows checked."""
    ex = monitor.executor
    tier, pool = getattr(ex, "tier", None), getattr(ex, "host_pool", None)
    if tier is None or pool is None:
        return 0
    size = state.geometry.page_size
    host_slots: list[int] = []
    contents: list[Content] = []
    for node_id, pages in tier.backup.items():
        record = monitor.node_content.get(node_id)
        if record is None or len(record) != len(pages) * size:
            problems.append(f"backed-up node {node_id} has no matching tag record")
            continue
        host_slots.extend(expand_pages(pages, size))
        contents.extend(record)
    for node_id in tier.evicted.keys():
        if node_id not in monitor.node_content:
            problems.append(f"host-only node {node_id} has no tag record")
    if not contents:
        return 0
    rows = TagRows(contents, ex.device)
    index = torch.tensor(host_slots, dtype=torch.int64)
    for layer in range(ex.layer_num):
        want = monitor.expected(rows, layer)
        got = pool.read(layer, index)
        if not all(torch.equal(g, w.cpu()) for g, w in zip(got, want, strict=False)):
            problems.append(f"layer {layer}: a host copy does not read back its node's tags")
    return len(contents) * ex.layer_num
