"""Planning radix-tree walks: ``plan_match`` and ``plan_insert`` (SGLang semantics).

Both are page-aligned and both *mutate* in SGLang: a match that ends inside a
node splits it, and every node a walk visits gets the walk's access time.
Here those mutations are events, emitted in this order::

    Touch(root + visited nodes, t)      one time for the whole walk
    Split(node, at, new_id, t + 1)      at most one per walk; new node is later
    Insert(parent, rest, ..., t + 2)    insert only; the new leaf is later still
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import attrs

from kvstate.events import Insert, Split, Touch
from kvstate.planner.builder import Builder
from kvstate.state import ROOT, RequestId, expand_pages


@attrs.frozen
class MatchResult:
    """A cached prefix: ``length`` tokens on ``pages``, ending at ``last_node``."""

    pages: tuple[int, ...]
    last_node: int
    length: int
    page_size: int = 1

    @property
    def slots(self) -> tuple[int, ...]:
        """Every slot of the prefix, in order (expanded on demand: O(length))."""
        return expand_pages(self.pages, self.page_size)

    def slots_from(self, start: int) -> tuple[int, ...]:
        """The slots of positions ``[start, length)`` (``start`` on a page boundary)."""
        return expand_pages(self.pages[start // self.page_size:], self.page_size)


@attrs.frozen
class InsertResult:
    prefix_len: int  # tokens that were already in the tree (the caller's copies are duplicates)
    last_node: int


def common_prefix(a: Sequence[int], b: Sequence[int], start: int = 0) -> int:
    """Length of the longest common prefix of ``a`` and ``b[start:]``, by slice compares (C
    speed; ``b`` is sliced only as far as ``a`` reaches, never copied whole)."""
    limit = max(0, min(len(a), len(b) - start))
    if a[:limit] == b[start:start + limit]:
        return limit
    low, high = 0, limit  # a[:low] == b[start:][:low], a[:high] != b[start:][:high]
    step = 64  # find the first differing chunk by scanning, then bisect inside it
    while high - low > step and a[low:low + step] == b[start + low:start + low + step]:
        low += step
    high = min(high, low + step)
    while high - low > 1:
        mid = (low + high) // 2
        if a[:mid] == b[start:start + mid]:
            low = mid
        else:
            high = mid
    return low


class _Walk(NamedTuple):
    visited: tuple[int, ...]
    node: int  # deepest node fully matched
    position: int  # tokens matched through ``node``
    split_node: int | None  # child that matches only ``split_at`` more tokens
    split_at: int
    pages: tuple[int, ...]  # pages of every fully matched node, in order


def _walk(state: Any, key: tuple[int, ...]) -> _Walk:
    size = state.geometry.page_size
    nodes = state.nodes
    child_key = state.geometry.child_key
    node_id, position = ROOT, 0
    visited = [ROOT]
    pages: list[int] = []
    length = len(key)
    while position < length:
        child_id = nodes[node_id].children.get(child_key(key[position:position + size]))
        if child_id is None:
            break
        child = nodes[child_id]
        visited.append(child_id)
        child_tokens = child.key
        end = position + len(child_tokens)
        segment = key[position:end]  # only as long as the node: one pass over the key in all
        if segment != child_tokens:
            matched = common_prefix(child_tokens, segment) // size * size
            return _Walk(tuple(visited), node_id, position, child_id, matched, tuple(pages))
        pages.extend(child.pages)
        node_id, position = child_id, end
    return _Walk(tuple(visited), node_id, position, None, 0, tuple(pages))


def plan_match(b: Builder, key: Sequence[int], *, limit: int | None = None) -> MatchResult:
    """Longest page-aligned cached prefix of ``key[:limit]``, splitting a partly matched node.

    Emits ``Touch`` (the root and every node walked) and at most one ``Split``.
    """
    state = b.state
    size = state.geometry.page_size
    stop = len(key) if limit is None else max(0, min(limit, len(key)))
    tokens = tuple(key[: stop // size * size])
    if not tokens:
        return MatchResult((), ROOT, 0, size)
    walk = _walk(state, tokens)
    time = state.clock + 1
    b.emit(Touch(walk.visited, time))
    pages = walk.pages
    last, length = walk.node, walk.position
    if walk.split_node is not None:
        new_id = state.next_node_id
        b.emit(Split(walk.split_node, walk.split_at, new_id, time + 1))
        pages = pages + tuple(b.state.nodes[new_id].pages)
        last, length = new_id, walk.position + walk.split_at
    return MatchResult(pages, last, length, size)


def plan_insert(b: Builder, key: Sequence[int], slots: Sequence[int] | None,
                owner: RequestId, *, pages: Sequence[int] | None = None) -> InsertResult:
    """Insert page-aligned ``key -> slots`` (or ``pages``, one per page of ``key``);
    ``owner``'s holds on new pages move to the tree.

    Emits ``Touch``, at most one ``Split`` and at most one ``Insert``.
    """
    state = b.state
    size = state.geometry.page_size
    aligned = len(key) // size * size
    tokens = tuple(key[:aligned])
    time = state.clock + 1
    if not tokens:
        b.emit(Touch((ROOT,), time))
        return InsertResult(0, ROOT)
    walk = _walk(state, tokens)
    b.emit(Touch(walk.visited, time))
    parent, position = walk.node, walk.position
    if walk.split_node is not None:
        time += 1
        parent = b.state.next_node_id
        b.emit(Split(walk.split_node, walk.split_at, parent, time))
        position += walk.split_at
    if position == len(tokens):
        return InsertResult(position, parent)
    time += 1
    leaf = b.state.next_node_id
    if pages is not None:
        values = expand_pages(tuple(pages[position // size: aligned // size]), size)
    else:
        assert slots is not None, "plan_insert needs slots or pages"
        values = tuple(slots[position:aligned])
    b.emit(Insert(parent, tokens[position:], values, leaf, time, owner))
    return InsertResult(position, leaf)


def prefix_length(state: Any, key: Sequence[int]) -> int:
    """Tokens of the page-aligned ``key`` already in the tree (read-only, no events)."""
    size = state.geometry.page_size
    tokens = tuple(key[: len(key) // size * size])
    if not tokens:
        return 0
    walk = _walk(state, tokens)
    return walk.position + (walk.split_at if walk.split_node is not None else 0)
