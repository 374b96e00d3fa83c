"""Canonical dumps of a Mamba hybrid tree, for ``tools/diff_sglang_mamba.py``.

Node ids differ between SGLang's cores and kvstate, so a node is named by
its root path (every token from the root to its end).  ``sglang_tree``
reads SGLang 0.5.23's Python tree core; ``kvstate_tree`` the kvstate state.
Each returns ``[nodes, swa_lru, mamba_lru]``: the nodes in path order as
``[path, FULL slots, SWA slots or None, Mamba slot or None, FULL lock_ref,
SWA lock_ref, Mamba lock_ref, has a window receipt]`` (the SWA fields are
None without an SWA pool), then each auxiliary LRU from its most recent
end, as paths.
"""

from __future__ import annotations

from typing import Any


def sglang_tree(cache: Any) -> list[Any]:
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

    core = cache.tree_core
    full, swa, mamba = ComponentType.FULL, ComponentType.SWA, ComponentType.MAMBA
    has_swa = swa in core.lru_lists
    paths: dict[int, tuple[int, ...]] = {}
    nodes = []
    stack = [(core.root_node, ())]
    while stack:
        node, path = stack.pop()
        for child in node.children.values():
            child_path = path + tuple(child.key.token_ids[: len(child.key)])
            paths[child.id] = child_path
            data = child.component_data
            state = data[mamba].value
            entry = [list(child_path), data[full].value.tolist(), None,
                     None if state is None else int(state.reshape(-1)[0]), data[full].lock_ref,
                     None, data[mamba].lock_ref, None]
            if has_swa:
                swa_value = data[swa].value
                entry[2] = None if swa_value is None else swa_value.tolist()
                entry[5] = data[swa].lock_ref
                entry[7] = data[swa].metadata.get("uuid") is not None
            nodes.append(entry)
            stack.append((child, child_path))
    lrus = []
    for component in (swa, mamba):
        if component not in core.lru_lists:
            lrus.append(None)
            continue
        lru = core.lru_lists[component]
        pointer, order = lru._pt, []
        node = lru.head.lru_next[pointer]
        while node is not lru.tail:
            order.append(list(paths[node.id]))
            node = node.lru_next[pointer]
        lrus.append(order)
    return [sorted(nodes), *lrus]


def kvstate_tree(cache: Any) -> list[Any]:
    from kvstate.planner.mamba_evict import mamba_lru
    from kvstate.planner.swa_evict import swa_lru
    from kvstate.state import ROOT

    view = cache.engine.view
    size, states = view.geometry.page_size, view.mamba.nodes
    has_swa = view.swa is not None
    paths: dict[int, tuple[int, ...]] = {ROOT: ()}
    nodes = []
    stack = [ROOT]
    while stack:
        node_id = stack.pop()
        for child_id in view.nodes[node_id].children.values():
            child = view.nodes[child_id]
            paths[child_id] = paths[node_id] + tuple(child.key)
            slots = [p * size + k for p in child.pages for k in range(size)]
            state = states.get(child_id)
            entry = [list(paths[child_id]), slots, None,
                     state.slot if state is not None and state.slot else None, child.lock_ref,
                     None, 0 if state is None else state.lock_ref, None]
            if has_swa:
                peer = view.swa.peer
                entry[2] = ([peer[p] * size + k for p in child.pages for k in range(size)]
                            if child.swa.live else None)
                entry[5], entry[7] = child.swa.lock_ref, bool(child.swa.uuid)
            nodes.append(entry)
            stack.append(child_id)
    swa_order = [list(paths[n]) for n in reversed(swa_lru(view))] if has_swa else None
    mamba_order = [list(paths[n]) for n in reversed(mamba_lru(view))]
    return [sorted(nodes), swa_order, mamba_order]
