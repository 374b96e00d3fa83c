"""FULL + SWA hybrid (SGLang 0.5.23's ``UnifiedRadixCache(FULL, SWA)``): match and locks.

A hit needs a window: the match walks like the radix match (page-aligned,
splitting a partly matched node), and a node counts as a hit only when at
least ``window`` tokens of live SWA end at it, counted in whole nodes from
the last SWA tombstone above it (from the root, any length will do: the
sequence starts there).  The hit ends at the deepest such node; the FULL KV
may reach further, and the last page boundary of that FULL reach, when it
is beyond the hit, is the *branching seqlen* that a request inserts up to at
its first checkpoint.

Events of a match, in SGLang's order: ``Split`` (+ ``Touch`` of the node's
lower half, which a split refreshes), ``SwaTouch`` of the hit and its window
ancestors (``window + page`` tokens), ``Touch`` of the hit and every
ancestor.  Nodes walked past the hit keep their times.

A request's tree lock is ``Lock`` (the FULL path to the root) plus
``SwaLock`` (one window of SWA from the node up); its receipt is the
window's boundary ``uuid``.  Release is ``SwaUnlock`` first, then ``Unlock``.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

import msgspec

from kvstate.events import Lock, Split, SwaLock, SwaTouch, SwaUnlock, Touch, Unlock
from kvstate.planner.builder import Builder
from kvstate.planner.tree_ops import common_prefix
from kvstate.state import ROOT, expand_pages, path_to_root


class UnifiedMatch(msgspec.Struct, frozen=True, gc=False):
    """A hybrid match: ``length`` hit tokens ending at ``last_node`` (SWA-valid), the FULL
    reach ``full_hit``, and the branch point (``None`` when the hit reaches it)."""

    length: int
    last_node: int
    full_hit: int
    branching_seqlen: int | None
    pages: tuple[int, ...] = ()


class Receipt(msgspec.Struct, frozen=True, gc=False):
    """What unlocking a hybrid tree lock needs: the node and its window's receipt (0: the
    window reached the root; ``swa=False``: no SWA part was taken, or it was released)."""

    node: int
    uuid: int = 0
    swa: bool = True


EMPTY = UnifiedMatch(0, ROOT, 0, None)


def plan_unified_match(b: Builder, key: Sequence[int], *, window: int) -> UnifiedMatch:
    """Longest SWA-valid page-aligned prefix of ``key``; see the module docstring.

    A key shorter than a page matches nothing and changes nothing (no event).
    """
    state = b.state
    size = state.geometry.page_size
    tokens = tuple(key[: len(key) // size * size])
    if not tokens:
        return EMPTY
    # Read once (a split, the one event inside the walk, ends it and reads it again: the
    # persistent backend gives a new state per event).
    nodes = state.nodes
    node_id, position, full_hit = ROOT, 0, 0
    best, best_len = ROOT, 0
    run = -1  # live SWA tokens since the last tombstone; -1: none above (infinite)
    while position < len(tokens):
        # the child index's key (``Geometry.child_key``): a token, or a page of tokens
        child_id = nodes[node_id].children.get(
            tokens[position] if size == 1 else tokens[position:position + size])
        if child_id is None:
            break
        child = nodes[child_id]
        matched = common_prefix(child.key, tokens, position) // size * size
        full_hit += matched
        if matched < len(child.key):
            child_id = _split(b, child_id, matched)
            nodes = b.state.nodes
        run = _extend_run(run, nodes[child_id])
        node_id, position = child_id, position + matched
        if run < 0 or run >= window:
            best, best_len = node_id, position
        if matched < len(child.key):
            break
    if best != ROOT:  # the root's window is empty: nothing to refresh
        refresh_window(b, best, window)
    nodes = b.state.nodes
    path = list(path_to_root(nodes, best))
    b.emit(Touch((*path, ROOT), b.state.clock + 1))
    aligned = full_hit // size * size
    return UnifiedMatch(best_len, best, full_hit, aligned if aligned > best_len else None,
                        path_pages(nodes, path))


def _extend_run(run: int, node: Any) -> int:
    """The SWA validator's count after ``node``: reset by a tombstone, grown by live SWA."""
    if not node.swa.live:
        return 0
    return run if run < 0 else run + len(node.key)


def _split(b: Builder, node_id: int, at: int) -> int:
    """Split ``node_id`` at ``at`` (the new top half's id is returned); the lower half is
    stamped afresh, as SGLang's split refreshes it."""
    new_id = b.state.next_node_id
    b.emit(Split(node_id, at, new_id, b.state.clock + 1))
    b.emit(Touch((node_id,), b.state.clock + 1))
    return int(new_id)


def split_node(b: Builder, node_id: int, at: int) -> int:
    """Public form of the split the hybrid walks make (``Split`` + ``Touch``)."""
    return _split(b, node_id, at)


def path_pages(nodes: Any, path: Sequence[int]) -> tuple[int, ...]:
    """The FULL pages of ``path`` (node ids from the deepest up, as ``path_to_root``
    gives them), root end first."""
    return tuple(chain.from_iterable([nodes[n].pages for n in reversed(path)]))


def refresh_window(b: Builder, node_id: int, window: int) -> None:
    """Move ``node_id``'s live SWA and its ancestors' to the recent end of the SWA LRU,
    until ``window + page`` tokens are covered (tombstones count, but stay out).
    Emits one ``SwaTouch`` (nothing when no node is live)."""
    nodes = b.state.nodes
    span = window + b.state.geometry.page_size
    covered = 0
    live = []
    while node_id != ROOT and covered < span:
        node = nodes[node_id]
        if node.swa.live:
            live.append(node_id)
        covered += len(node.key)
        node_id = node.parent
    if live:
        b.emit(SwaTouch(tuple(live), b.state.clock + 1))


def path_slots(state: Any, node_id: int) -> tuple[int, ...]:
    """Every FULL slot on the path from the root to ``node_id``."""
    nodes = state.nodes
    return expand_pages(path_pages(nodes, list(path_to_root(nodes, node_id))),
                        state.geometry.page_size)


# -- locks -------------------------------------------------------------------------------
def window_top(state: Any, node_id: int, window: int) -> tuple[int, int]:
    """The upper end of the SWA window lock from ``node_id`` and its receipt: the first
    node at which ``window`` tokens are covered (tombstones counted), or ``(ROOT, 0)``."""
    nodes = state.nodes
    covered = 0
    while node_id != ROOT:
        node = nodes[node_id]
        covered += len(node.key)
        if covered >= window:
            return node_id, node.swa.uuid or state.swa.next_uuid
        node_id = node.parent
    return ROOT, 0


def plan_unified_lock(b: Builder, node_id: int, *, window: int) -> Receipt:
    """Lock ``node_id``'s FULL path and its SWA window (``Lock``, ``SwaLock``)."""
    if node_id == ROOT:
        return Receipt(ROOT, 0, False)
    b.emit(Lock(node_id))
    top, uuid = window_top(b.state, node_id, window)
    b.emit(SwaLock(node_id, top, uuid))
    return Receipt(node_id, uuid)


def plan_release_swa(b: Builder, receipt: Receipt) -> Receipt:
    """Drop the SWA part of a lock early (SGLang's ``release_swa``); ``SwaUnlock``."""
    if receipt.node == ROOT or not receipt.swa:
        return receipt
    b.emit(SwaUnlock(receipt.node, receipt.uuid))
    return msgspec.structs.replace(receipt, swa=False)


def plan_unified_unlock(b: Builder, receipt: Receipt) -> None:
    """Release a lock: ``SwaUnlock`` (unless released early), then ``Unlock``."""
    if receipt.node == ROOT:
        return
    plan_release_swa(b, receipt)
    b.emit(Unlock(receipt.node))
