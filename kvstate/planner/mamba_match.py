"""FULL + MAMBA (and FULL + SWA + MAMBA) hybrid match and locks (SGLang 0.5.23's
``UnifiedRadixCache`` with a ``MambaComponent``).

A recurrent layer can resume only from a cached state, and a state belongs
to the exact prefix it was computed on (the end of one node).  So the match
walks like the radix match (page-aligned, splitting a partly matched node)
and runs every component's validator on each node it reaches: a node is a
hit when it holds a Mamba state (``MambaTier.nodes``) and, with an SWA pool,
when at least a window of live SWA ends there.  The hit ends at the deepest
such node, never past the last valid state; the FULL KV may reach further:

* ``mamba_branching_seqlen``: the last checkpoint-grid boundary inside the
  FULL reach, when it is past the hit (where a new request should leave a
  state for the next one; grid = lcm(mamba chunk, page));
* ``swa_branching_seqlen``: the SWA pool's own branch point (page boundary).

Events of a match, in SGLang's order: ``Split`` (+ ``Touch`` of its lower
half), ``SwaTouch`` of the hit's window, ``MambaTouch`` of the hit (only the
state used moves in the Mamba LRU), ``Touch`` of the hit and its ancestors.

A request's lock is ``Lock`` (FULL path), ``SwaLock`` (one window) and
``MambaLock`` (the hit's state only); release replays it in reverse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from kvstate.events import Lock, MambaLock, MambaTouch, MambaUnlock, SwaLock, SwaUnlock, Touch, Unlock
from kvstate.planner.builder import Builder
from kvstate.planner.swa_match import path_pages, refresh_window, split_node, window_top
from kvstate.planner.tree_ops import common_prefix
from kvstate.state import ROOT, path_to_root


class MambaMatch(msgspec.Struct, frozen=True, gc=False):
    """A hybrid match: ``length`` hit tokens ending at ``last_node`` (valid for every
    component), the FULL reach, both branch points (``None``: the hit reaches them) and
    the hit's Mamba state slot (0 at the root).  (A msgspec struct, as the per-decision
    records of the vLLM planner are: built in C, several times cheaper than an attrs
    class; it holds ints only, so it is never part of a cycle.)"""

    length: int
    last_node: int
    full_hit: int
    swa_branching_seqlen: int | None = None
    mamba_branching_seqlen: int | None = None
    state: int = 0
    pages: tuple[int, ...] = ()  # the FULL pages from the root to ``last_node``


class MambaReceipt(msgspec.Struct, frozen=True, gc=False):
    """What releasing a hybrid lock needs: the node, its SWA window receipt (0: none or
    the root), and which auxiliary locks it still holds."""

    node: int
    uuid: int = 0
    swa: bool = False
    mamba: bool = False


EMPTY = MambaMatch(0, ROOT, 0)
NO_LOCK = MambaReceipt(ROOT)


def state_of(state: Any, node_id: int) -> int:
    """The Mamba state slot cached at ``node_id`` (0: none)."""
    component = state.mamba.nodes.get(node_id)
    return 0 if component is None else int(component.slot)


def plan_mamba_match(b: Builder, key: Sequence[int], *, grid: int,
                     window: int | None = None) -> MambaMatch:
    """The longest prefix of ``key`` every component accepts; see the module docstring.
    ``window`` is the SWA window (``None``: no SWA pool).  A key shorter than a page
    matches nothing and changes nothing."""
    size = b.state.geometry.page_size
    tokens = tuple(key[: len(key) // size * size])
    if not tokens:
        return EMPTY
    # Read once (a split, the one event inside the walk, ends it and reads them again:
    # the persistent backend gives a new state per event).
    nodes, states = b.state.nodes, b.state.mamba.nodes
    node_id, position, full_hit = ROOT, 0, 0
    best, best_len = ROOT, 0
    run = -1  # live SWA tokens since the last tombstone; -1: none above (unbounded)
    while position < len(tokens):
        # the child index's key (``Geometry.child_key``): a token, or a page of tokens
        child_id = nodes[node_id].children.get(
            tokens[position] if size == 1 else tokens[position:position + size])
        if child_id is None:
            break
        child = nodes[child_id]
        matched = common_prefix(child.key, tokens, position) // size * size
        full_hit += matched
        partial = matched < len(child.key)
        if partial:
            child_id = split_node(b, child_id, matched)
            nodes, states = b.state.nodes, b.state.mamba.nodes
        node_id, position = child_id, position + matched
        component = states.get(node_id)  # every validator runs on every node
        valid = component is not None and component.slot > 0
        if window is not None:
            node = nodes[node_id]
            run = 0 if not node.swa.live else (run if run < 0 else run + len(node.key))
            valid = valid and (run < 0 or run >= window)
        if valid:
            best, best_len = node_id, position
        if partial:
            break
    if window is not None and best != ROOT:
        refresh_window(b, best, window)
    slot = state_of(b.state, best) if best != ROOT else 0
    if slot:
        b.emit(MambaTouch(best, b.state.clock + 1))
    nodes = b.state.nodes
    path = list(path_to_root(nodes, best))
    b.emit(Touch((*path, ROOT), b.state.clock + 1))
    page_floor = full_hit // size * size
    grid_floor = full_hit // grid * grid
    return MambaMatch(best_len, best, full_hit,
                      page_floor if window is not None and page_floor > best_len else None,
                      grid_floor if grid_floor > best_len else None, slot,
                      path_pages(nodes, path))


# -- locks -------------------------------------------------------------------------------
def plan_mamba_lock(b: Builder, node_id: int, *, window: int | None = None) -> MambaReceipt:
    """Lock ``node_id``: its FULL path (``Lock``), its SWA window (``SwaLock``) and its
    Mamba state (``MambaLock``; a node without a state takes none)."""
    if node_id == ROOT:
        return NO_LOCK
    b.emit(Lock(node_id))
    uuid, swa = 0, False
    if window is not None:
        top, uuid = window_top(b.state, node_id, window)
        b.emit(SwaLock(node_id, top, uuid))
        swa = True
    mamba = state_of(b.state, node_id) > 0
    if mamba:
        b.emit(MambaLock(node_id))
    return MambaReceipt(node_id, uuid, swa, mamba)


def plan_mamba_release_swa(b: Builder, receipt: MambaReceipt) -> MambaReceipt:
    """SGLang's ``release_swa``: drop the SWA window and, below it in eviction priority,
    the Mamba lock (``SwaUnlock``, ``MambaUnlock``).  Without an SWA part, nothing."""
    if receipt.node == ROOT or not receipt.swa:
        return receipt
    b.emit(SwaUnlock(receipt.node, receipt.uuid))
    if receipt.mamba:
        b.emit(MambaUnlock(receipt.node))
    return msgspec.structs.replace(receipt, swa=False, mamba=False)


def plan_mamba_unlock(b: Builder, receipt: MambaReceipt) -> None:
    """Release a lock: ``MambaUnlock``, ``SwaUnlock`` (those still held), ``Unlock``."""
    if receipt.node == ROOT:
        return
    if receipt.mamba:
        b.emit(MambaUnlock(receipt.node))
    if receipt.swa:
        b.emit(SwaUnlock(receipt.node, receipt.uuid))
    b.emit(Unlock(receipt.node))
