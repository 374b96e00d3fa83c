"""Read-only views of the radix tree: ``TreeNode`` handles.

A handle is just (cache, node id); every attribute reads the cache's
current state (``engine.view``), so handles never go stale across splits: a
split keeps the bottom half under the old id.  ``evicted`` is True once the
node is gone; other attributes of an evicted node raise ``KeyError``.
"""

from __future__ import annotations

from typing import Any

import torch

from kvstate.state import expand_pages


class TreeNode:
    __slots__ = ("_cache", "id")

    def __init__(self, cache: Any, node_id: int) -> None:
        self._cache = cache
        self.id = node_id

    def _node(self) -> Any:
        node = self._cache.engine.view.nodes.get(self.id)
        if node is None:
            raise KeyError(f"tree node {self.id} has been evicted")
        return node

    @property
    def evicted(self) -> bool:
        return self.id not in self._cache.engine.view.nodes

    @property
    def key(self) -> list[int]:
        return list(self._node().key)

    @property
    def value(self) -> torch.Tensor:
        pages = self._node().pages
        return torch.tensor(expand_pages(pages, self._cache.page_size), dtype=torch.int64)

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
