"""Read-only views of the radix tree: ``TreeNode`` handles and a printable tree.

A handle is just (cache, node id); every attribute reads the cache's current
state, so handles never go stale across splits.  ``evicted`` is True once
the node is gone.
"""

from __future__ import annotations

from typing import Any

import torch

from kvstate.state import ROOT, State


class TreeNode:
    __slots__ = ("_cache", "id")

    def __init__(self, cache: Any, node_id: int) -> None:
        self._cache = cache
        self.id = node_id

    def _node(self) -> Any:
        node = self._cache.engine.state.nodes.get(self.id)
        if node is None:
            raise KeyError(f"tree node {self.id} has been evicted")
        return node

    @property
    def evicted(self) -> bool:
        return self.id not in self._cache.engine.state.nodes

    @property
    def key(self) -> list[int]:
        return list(self._node().key)

    @property
    def value(self) -> torch.Tensor:
        return torch.tensor(self._cache.engine.state.node_slots(self.id), dtype=torch.int64)

    @property
    def lock_ref(self) -> int:
        return int(self._node().lock_ref)

    @property
    def last_access_time(self) -> int:
        return int(self._node().last_access)

    @property
    def parent(self) -> TreeNode | None:
        parent = self._node().parent
        return None if parent < 0 else TreeNode(self._cache, parent)

    @property
    def children(self) -> dict[Any, TreeNode]:
        return {k: TreeNode(self._cache, v) for k, v in self._node().children.items()}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TreeNode) and other._cache is self._cache and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id})"


def format_tree(state: State, max_tokens: int = 12) -> str:
    """An indented listing: id, token count, first tokens, pages, lock_ref, access time."""
    lines: list[str] = []
    stack = [(ROOT, 0)]
    while stack:
        node_id, depth = stack.pop()
        node = state.nodes[node_id]
        if node_id == ROOT:
            lines.append(f"root  lock={node.lock_ref}  tokens={state.total_size()} "
                         f"(evictable {state.evictable_size}, protected {state.protected_size})")
        else:
            shown = list(node.key[:max_tokens])
            more = "..." if len(node.key) > max_tokens else ""
            pages = list(node.pages[:6])
            lines.append(f"{'  ' * depth}#{node_id} len={len(node.key)} key={shown}{more} "
                         f"pages={pages}{'...' if len(node.pages) > 6 else ''} "
                         f"lock={node.lock_ref} t={node.last_access}")
        children = sorted(node.children.values(), reverse=True)
        stack.extend((child, depth + 1) for child in children)
    return "\n".join(lines)
