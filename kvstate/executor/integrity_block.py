"""Integrity mode for block-mode (vLLM) states: null positions, cached blocks, seeding, tree reads.

Helpers of :class:`~kvstate.executor.integrity.IntegrityMonitor`; they read
and update the monitor's bookkeeping (``slot_content``, ``cached``,
``errors``) and write tags through it; a ``State`` (frozen or live) is only read.

In block mode a tree node is one block that may have several cached copies
(one per page), each written by whichever request computed it, so the
monitor keeps no per-node record: a cached page's truth is its own
``slot_content``, and its node's depth says which positions it must hold.
A request-table entry of page 0 (the null block of a sliding window) holds
no live KV: such a position gets :func:`null_content` and must read back
whatever the padding page holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kvstate.executor.index_plan import node_depth, page_slots
from kvstate.executor.integrity_tags import NULL_UID, Content
from kvstate.state import ROOT


def null_content(position: int, page_size: int) -> Content:
    """What a position mapped to the null page reads: padding row ``position % page_size``."""
    return NULL_UID, position % page_size


def cache_blocks(monitor: Any, cached: Iterable[tuple[int, int, Sequence[int]]]) -> None:
    """A held page became a cached copy of a node whose first token sits at ``depth``.

    A page whose KV was computed for other positions is reported (the tree
    would serve it to the wrong place); a page nobody computed (a pool-level
    allocation) gets fresh tags, as if the engine had written it.
    """
    size = monitor.size
    for node_id, depth, slots in cached:
        monitor.cached[slots[0] // size] = (node_id, depth)
        monitor.check_pages.add(slots[0] // size)
        uid = 0
        fresh_slots: list[int] = []
        fresh: list[Content] = []
        for index, slot in enumerate(slots):
            position = depth + index
            content = monitor.slot_content.get(slot)
            if content is None:
                uid = uid or monitor._fresh_uid()
                content = (uid, position)
                monitor.slot_content[slot] = content
                fresh_slots.append(slot)
                fresh.append(content)
            elif content[1] != position:
                monitor.errors.append(f"block node {node_id} caches slot {slot} as position "
                                      f"{position}, whose KV was computed for position {content[1]}")
        monitor.write_tags(fresh_slots, fresh)


def seed_block_cache(monitor: Any, state: Any) -> None:
    """Tag the cached pages a non-empty block-mode state already holds (as if freshly written)."""
    size = state.geometry.page_size
    depths = _depths(state)
    cache_blocks(monitor, [(node_id, depths[node_id], page_slots((page,), size))
                           for page, node_id in sorted(state.page_node.items())])


def block_tree_reads(monitor: Any, state: Any, problems: list[str]
                     ) -> tuple[list[int], list[Content]]:
    """Slots of every cached page and the tags they must read back; mismatched records go to ``problems``."""
    size = state.geometry.page_size
    depths = _depths(state)
    slots: list[int] = []
    contents: list[Content] = []
    for page, node_id in state.page_node.items():
        page_contents = [monitor.slot_content.get(slot) for slot in range(page * size, page * size + size)]
        depth = depths[node_id]
        wrong = [index for index, c in enumerate(page_contents) if c is None or c[1] != depth + index]
        if wrong:
            problems.append(f"cached page {page} (tree node {node_id}) holds no KV computed for "
                            f"position {depth + wrong[0]}")
            continue
        slots.extend(range(page * size, page * size + size))
        contents.extend(c for c in page_contents if c is not None)
    return slots, contents


def _depths(state: Any) -> dict[int, int]:
    """Depth (tokens above its first token) of every tree node, walking down from the root once."""
    nodes = state.nodes
    depths = {ROOT: 0}
    stack = [ROOT]
    while stack:
        node_id = stack.pop()
        node = nodes[node_id]
        below = depths[node_id] + (len(node.key) if node_id != ROOT else 0)
        for child in node.children.values():
            depths[child] = below
            stack.append(child)
    missing = [n for n in nodes.keys() if n not in depths]
    for node_id in missing:  # not reachable from the root: fall back to the parent walk
        depths[node_id] = node_depth(state, node_id)
    return depths
