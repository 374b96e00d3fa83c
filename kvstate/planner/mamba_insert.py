"""FULL + MAMBA (and FULL + SWA + MAMBA) hybrid insert (SGLang 0.5.23's ``UnifiedTreeCore``
insert with a ``MambaComponent``).

The walk is the unified tree's (page-aligned key; P = page)::

    walked node:  Touch; Split where the key diverges (+ Touch of the lower half);
                  the inserter's copies of [prev_prefix_len, ...) are freed
                  (with an SWA pool: ``kvstate.planner.swa_insert``, which also
                  recovers SWA tombstones inside the inserter's window)
    new leaf:     Insert
    commit:       the insert's end node takes the inserter's state slot
                  (``MambaCommit``, most recent in the Mamba LRU; an existing
                  node also gets a FULL ``Touch``), or, when it already holds
                  a state, keeps it (``MambaTouch`` + ``Touch``; the result
                  says ``mamba_exist`` and the inserter keeps its slot)

The slot is SGLang's ``InsertParams.mamba_value``: a request's running state
(a finished request donating it), a ping-pong track slot, or a DETACHED slot
(a checkpoint forked or donated for the insert, or a bare allocation).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from kvstate.events import Insert, MambaCommit, MambaTouch, Touch
from kvstate.planner.builder import Builder
from kvstate.planner.mamba_match import state_of
from kvstate.planner.swa_insert import InsertSpec, free_full, plan_unified_insert
from kvstate.planner.swa_match import split_node
from kvstate.planner.tree_ops import common_prefix
from kvstate.state import ROOT, RequestId, expand_pages


class MambaInsertSpec(msgspec.Struct, frozen=True, gc=False):
    """What SGLang's ``InsertParams`` carry besides the key and the FULL value."""

    window: int | None = None  # the SWA window (None: no SWA pool)
    prev_prefix_len: int = 0  # the inserter's tree-owned prefix: never its to free
    swa_cursor: int = 0  # the inserter's SWA eviction cursor
    at_head: bool = False  # FULL frees at the head (pages) or the tail (tokens)


class MambaInserted(msgspec.Struct, frozen=True, gc=False):
    prefix_len: int  # tokens the tree had already
    last_node: int  # the node the key ends at (it holds a state afterwards)
    mamba_exist: bool  # the node had a state already: the inserter keeps its slot


def plan_mamba_insert(b: Builder, key: Sequence[int], pages: Sequence[int], owner: RequestId,
                      slot: int, spec: MambaInsertSpec) -> MambaInserted:
    """Insert page-aligned ``key`` backed by ``pages`` (one FULL page per key page, held
    by ``owner``) with the Mamba state in ``slot`` at its end."""
    size = b.state.geometry.page_size
    aligned = len(key) // size * size
    if not aligned:
        return MambaInserted(0, ROOT, True)  # SGLang: nothing to insert, the state exists
    if b.state.swa is not None:
        inserted = plan_unified_insert(
            b, key[:aligned], pages, owner,
            InsertSpec(spec.window or 0, spec.prev_prefix_len, spec.swa_cursor, None, spec.at_head))
        target, prefix = inserted.last_node, inserted.prefix_len
    else:
        target, prefix = _walk(b, tuple(key[:aligned]), list(pages[: aligned // size]), owner,
                               spec)
    return MambaInserted(prefix, target, _commit(b, target, slot, new_leaf=prefix < aligned))


def _walk(b: Builder, tokens: tuple[int, ...], values: list[int], owner: RequestId,
          spec: MambaInsertSpec) -> tuple[int, int]:
    """The FULL-only walk: the end node and the tokens the tree had already."""
    size = b.state.geometry.page_size
    child_key = b.state.geometry.child_key
    node_id, total = ROOT, 0
    while total < len(tokens):
        child_id = b.state.nodes[node_id].children.get(child_key(tokens[total:total + size]))
        if child_id is None:
            break
        b.emit(Touch((child_id,), b.state.clock + 1))
        matched = common_prefix(b.state.nodes[child_id].key, tokens, total) // size * size
        if matched < len(b.state.nodes[child_id].key):
            child_id = split_node(b, child_id, matched)
        start = total + max(0, spec.prev_prefix_len - total)
        if start < total + matched:
            free_full(b, values[start // size: (total + matched) // size], spec.at_head)
        node_id, total = child_id, total + matched
    if total < len(tokens):
        new_id = b.state.next_node_id
        slots = expand_pages(values[total // size:], size)
        b.emit(Insert(node_id, tokens[total:], slots, new_id, b.state.clock + 1, owner))
        node_id = new_id
    return node_id, total


def _commit(b: Builder, node_id: int, slot: int, *, new_leaf: bool) -> bool:
    """The Mamba component's commit on the insert's end node; whether a state existed."""
    if not new_leaf and state_of(b.state, node_id):
        b.emit(MambaTouch(node_id, b.state.clock + 1))
        b.emit(Touch((node_id,), b.state.clock + 1))
        return True
    b.emit(MambaCommit(node_id, slot, b.state.clock + 1))
    if not new_leaf:
        b.emit(Touch((node_id,), b.state.clock + 1))
    return False
