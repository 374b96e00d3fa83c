"""Canonical dumps of a hybrid tree, for ``tools/diff_sglang_hybrid.py``.

Node ids differ between SGLang's cores and kvstate, so a node is named by
its root path (every token from the root to its end).  ``sglang_tree``
reads SGLang 0.5.23's Python tree core; ``kvstate_tree`` the kvstate state.
Each returns ``[nodes, lru]``: the nodes in path order as ``[path, FULL
slots, SWA slots or None (a tombstone), FULL lock_ref, SWA lock_ref, has a
window receipt]`` and the SWA LRU from its most recent end, as paths.
"""

from __future__ import annotations

from typing import Any


def sglang_tree(cache: Any) -> list[Any]:
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

    core = cache.tree_core
    full, swa = ComponentType.FULL, ComponentType.SWA
    paths: dict[int, tuple[int, ...]] = {}
    nodes = []
    stack = [(core.root_node, ())]
    while stack:
        node, path = stack.pop()
        for child in node.children.values():
            child_path = path + tuple(child.key.token_ids[: len(child.key)])
            paths[child.id] = child_path
            full_data, swa_data = child.component_data[full], child.component_data[swa]
            swa_value = None if swa_data.value is None else swa_data.value.tolist()
            nodes.append([list(child_path), full_data.value.tolist(), swa_value,
                          full_data.lock_ref, swa_data.lock_ref,
                          swa_data.metadata.get("uuid") is not None])
            stack.append((child, child_path))
    lru_list = core.lru_lists[swa]
    pointer = lru_list._pt
    order = []
    node = lru_list.head.lru_next[pointer]
    while node is not lru_list.tail:
        order.append(list(paths[node.id]))
        node = node.lru_next[pointer]
    return [sorted(nodes), order]


def kvstate_tree(cache: Any) -> list[Any]:
    from kvstate.planner.swa_evict import swa_lru
    from kvstate.state import ROOT

    view = cache.engine.view
    size, peer = view.geometry.page_size, view.swa.peer
    paths: dict[int, tuple[int, ...]] = {ROOT: ()}
    nodes = []
    stack = [ROOT]
    while stack:
        node_id = stack.pop()
        for child_id in view.nodes[node_id].children.values():
            child = view.nodes[child_id]
            paths[child_id] = paths[node_id] + tuple(child.key)
            slots = [p * size + k for p in child.pages for k in range(size)]
            swa_slots = ([peer[p] * size + k for p in child.pages for k in range(size)]
                         if child.swa.live else None)
            nodes.append([list(paths[child_id]), slots, swa_slots, child.lock_ref,
                          child.swa.lock_ref, bool(child.swa.uuid)])
            stack.append(child_id)
    order = [list(paths[n]) for n in reversed(swa_lru(view))]
    return [sorted(nodes), order]
