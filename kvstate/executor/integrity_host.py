"""Integrity mode across the host tier: host copies read back their nodes' tags.

Helpers of :class:`~kvstate.executor.integrity.IntegrityMonitor`: they read
the monitor's ``node_content`` / ``host_content``, the state's host tier and
the executor's host pool; the checks mutate nothing but the ``problems``
list they are given (and the monitor's cached host :class:`TagLayout`), and
``seed_host`` writes tags into the host pool and the monitor's records.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.executor.index_plan import depth_below
from kvstate.executor.integrity_tags import Content, TagLayout
from kvstate.state import expand_pages


def _host_layout(monitor: Any) -> TagLayout | None:
    pool = getattr(monitor.executor, "host_pool", None)
    if pool is None:
        return None
    layout = getattr(monitor, "host_layout", None)
    if layout is None or layout.pool is not pool:
        layout = TagLayout.of_executor(monitor.executor, pool.page_views.tensors)
        layout.pool = pool  # type: ignore[attr-defined]  # which pool the views belong to
        monitor.host_layout = layout
    return layout


def _compare(monitor: Any, layout: TagLayout, host_slots: Sequence[int],
             contents: Sequence[Content], problems: list[str]) -> int:
    bad = layout.mismatches(host_slots, contents)
    if len(bad):
        slot = host_slots[int(bad[0])]
        layer = layout.first_bad_layer(slot, contents[int(bad[0])])
        problems.append(f"layer {layer}: a host copy does not read back its node's tags "
                        f"(host slot {slot}, {len(bad)} bad reads)")
    return len(contents) * monitor.executor.layer_num


def verify_host(monitor: Any, state: Any, problems: list[str]) -> int:
    """Every backed-up node's host pages read back the node's tags (all layers); rows checked."""
    tier, layout = state.host, _host_layout(monitor)
    if tier is None or layout is None:
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
    return _compare(monitor, layout, host_slots, contents, problems)


def check_host_slots(monitor: Any, host_slots: Sequence[int], problems: list[str]) -> int:
    """Host slots written since the last check read back what was offloaded there."""
    layout = _host_layout(monitor)
    if layout is None or not host_slots:
        return 0
    known = [slot for slot in host_slots if slot in monitor.host_content]
    if not known:
        return 0
    return _compare(monitor, layout, known, [monitor.host_content[s] for s in known], problems)


def seed_host(monitor: Any, state: Any) -> None:
    """Tag the host copies a non-empty starting state already has (as if freshly offloaded).

    A backed-up device node's host pages get its device tags; a host-only
    node (no device copy to take them from) gets fresh ones.
    """
    tier, layout = state.host, _host_layout(monitor)
    if tier is None or layout is None:
        return
    size = state.geometry.page_size
    for node_id in sorted(tier.backup.keys()):
        pages = tier.backup[node_id]
        contents = monitor.node_content.get(node_id)
        if contents is None:
            uid = monitor._fresh_uid()
            depth = _host_depth(state, node_id)
            contents = monitor.node_content[node_id] = [(uid, depth + i)
                                                        for i in range(len(pages) * size)]
        slots = expand_pages(pages, size)
        monitor.host_content.update(zip(slots, contents, strict=True))
        layout.write(slots, contents)


def _host_depth(state: Any, node_id: int) -> int:
    """Tokens above a host-only node's first token (its parents may be host-only too)."""
    tier = state.host
    depth = 0
    record = tier.evicted[node_id]
    while record.parent in tier.evicted:
        record = tier.evicted[record.parent]
        depth += len(record.key)
    return depth + depth_below(state, record.parent)
