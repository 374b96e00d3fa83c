"""The FULL rules' Mamba clauses (``kvstate.rules.tree``, ``kvstate.rules.rows``).

A closing row's Mamba slots become DETACHED (``release_row``); a dropped
tree gives its states back (``reset_tree_states``: tail, ascending slots);
``Evict`` takes only nodes whose state is gone (``refuse_evict``); a FULL
unlock never drops a node's FULL locks to its Mamba locks
(``refuse_unlock``).  Each changes nothing without a Mamba pool.
"""

from __future__ import annotations

from typing import Any

from kvstate.rules.mamba import component_of, touch_slots
from kvstate.rules.registry import Reject
from kvstate.state import DETACHED


def release_row(s: Any, request_id: Any) -> None:
    """A closing row's Mamba slots become DETACHED (for the caller to free or insert)."""
    tier = s.mamba
    if tier is None or request_id not in tier.rows:
        return
    live = [slot for slot in tier.rows.pop(request_id) if slot]
    for slot in live:
        tier.held[slot] = DETACHED
    touch_slots(s, live)


def reset_tree_states(s: Any) -> None:
    """The tree is dropped: its states go back free (tail, ascending slots); its locks go."""
    tier = s.mamba
    if tier is None:
        return
    slots = sorted(tier.snapshot("slot_node").keys())
    tier.free_slots = tier.free_slots.push_tail(slots)
    for name in ("nodes", "slot_node"):
        keys = list(tier.snapshot(name).keys())
        opened = getattr(tier, name)  # after the snapshot, which may reopen the map
        for key in keys:
            del opened[key]
    tier.evictable = tier.protected = 0


def refuse_evict(s: Any, node_id: int) -> None:
    """``Evict`` removes only nodes whose Mamba state is gone."""
    tier = s.mamba
    if tier is not None and component_of(tier, node_id).slot:
        raise Reject(f"node {node_id} still holds Mamba state "
                     f"{tier.nodes[node_id].slot}; drop it first (MambaEvict)")


def refuse_unlock(s: Any, node_id: int, node: Any) -> None:
    """A FULL unlock never drops a node's FULL locks to its Mamba locks."""
    tier = s.mamba
    if tier is None:
        return
    locks = component_of(tier, node_id).lock_ref
    if locks and node.lock_ref <= locks:
        raise Reject(f"node {node_id} still has {locks} Mamba lock(s) under its FULL lock; "
                     "release the Mamba lock first")
