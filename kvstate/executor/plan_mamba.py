"""Index planning for the Mamba state pool of a FULL + MAMBA hybrid (SGLang 0.5.23).

Pure: each planner reads the state the event applies to (``State.mamba``:
the free list, ``held``, ``rows``, ``nodes``) and returns an ``IndexPlan``;
importing this module registers them.  A Mamba slot holds one recurrent
state (every Mamba layer's conv and SSM state), so what an event means for
the executor is one of:

    MambaAlloc    slots leave the free list, held DETACHED        (``mamba_taken``)
    MambaBind     a row holds DETACHED slots                       (``mamba_bound``)
    MambaDonate   a track slot leaves its row for the tree, with the checkpoint in it,
                  and a fresh slot takes its place; no byte moves  (``mamba_donated``)
    MambaCopy     the source slot's state is copied into the destination slot
                                                                   (``mamba_copy_src/_dst``)
    MambaCommit   a tree node takes a held slot as its state, as it is; no byte moves
                  (``mamba_committed``, with the node's end: the state's position)
    MambaFree     slots go back free, poisoned in debug mode       (``mamba_freed``)
    MambaEvict    the nodes' states go back free, likewise         (``mamba_freed``)

``MambaTouch``, ``MambaLock`` and ``MambaUnlock`` change no byte and no
owner, so they have no planner.  Rows closing (``ReqFree``, ``Reset("rows")``)
leave their slots DETACHED: the row planners' ``closed`` says so.  The Mamba
part of a ``Reset`` is :func:`mamba_reset_part`, merged by its planner.
"""

from __future__ import annotations

from typing import Any

from kvstate.events import (
    MambaAlloc,
    MambaBind,
    MambaCommit,
    MambaCopy,
    MambaDonate,
    MambaEvict,
    MambaFree,
)
from kvstate.executor.index_plan import IndexPlan, depth_below, plans


@plans(MambaAlloc)
def _mamba_alloc(before: Any, event: MambaAlloc) -> IndexPlan:
    return IndexPlan(mamba_taken=tuple(event.slots))


@plans(MambaBind)
def _mamba_bind(before: Any, event: MambaBind) -> IndexPlan:
    return IndexPlan(mamba_bound=((event.row, tuple(event.slots)),))


@plans(MambaFree)
def _mamba_free(before: Any, event: MambaFree) -> IndexPlan:
    return IndexPlan(mamba_freed=tuple(event.slots))


@plans(MambaDonate)
def _mamba_donate(before: Any, event: MambaDonate) -> IndexPlan:
    old = before.mamba.rows[event.row][event.index]
    return IndexPlan(mamba_donated=((event.row, event.index, old, event.fresh),))


@plans(MambaCopy)
def _mamba_copy(before: Any, event: MambaCopy) -> IndexPlan:
    return IndexPlan(mamba_copy_src=(event.src,), mamba_copy_dst=(event.dst,))


@plans(MambaCommit)
def _mamba_commit(before: Any, event: MambaCommit) -> IndexPlan:
    return IndexPlan(mamba_committed=((event.node, event.slot,
                                       depth_below(before, event.node)),))


@plans(MambaEvict)
def _mamba_evict(before: Any, event: MambaEvict) -> IndexPlan:
    nodes = before.mamba.nodes
    return IndexPlan(mamba_freed=tuple(nodes[node].slot for node in event.nodes))


def mamba_reset_part(before: Any, scope: str) -> dict[str, Any]:
    """The Mamba fields of a ``Reset`` (empty without a Mamba pool): ``tree`` frees the tree's
    states, ``pages`` and ``all`` every slot that is not free (``rows`` frees none: the closed
    rows' slots become DETACHED)."""
    tier = before.mamba
    if tier is None or scope == "rows":
        return {}
    slots = set(tier.slot_node.keys())
    if scope != "tree":
        slots.update(tier.held.keys())
    return {"mamba_freed": tuple(sorted(slots))} if slots else {}


__all__ = ["mamba_reset_part"]
