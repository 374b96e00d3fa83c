"""Candidate events of the hybrid pools: the SWA pool and the Mamba state pool.

Like ``kvstate.checking.enabled`` (which calls ``hybrid_candidates`` only for
scopes that enable these kinds): deterministic order, candidates may be
illegal (the rules and the spec models ``specs.model_swa`` /
``specs.model_mamba`` must reject them alike), times are ``clock + 1``.

SWA (``kvstate.events.swa``):

* ``swa_alloc``: every held FULL page with the head of the SWA free list (a
  tree page, or one paired already, must be refused), and the first free
  FULL-held page with a taken SWA page (refused);
* ``swa_free`` / ``swa_evict`` / ``swa_publish`` / ``swa_touch``: every paired
  page or node (tombstones and locked windows must be refused), plus a node
  and its parent as one touch chain;
* ``swa_lock`` / ``swa_unlock``: every node, up to the root and up to itself
  (with the receipt it carries or the pool's next one), unlocks with every
  receipt on the path;
* ``swa_adopt`` / ``swa_rebind``: every tombstone with each owner's paired
  pages outside the tree (and, for a rebind, any paired pages outside it).

Mamba (``kvstate.events.mamba``): the head of the free list and a held slot
(refused); every open row with one or two DETACHED slots; every held slot
freed; every donation of a track entry for a DETACHED slot; every copy from
a tree state or held slot into a held slot; every commit of a held slot to a
node; touch, lock, unlock and evict of every node.

``cascade_steps`` lists two-event steps (one explorer edge each): a live,
unlocked leaf tombstoned and then evicted (SGLang's SWA or Mamba eviction of a
leaf with every component), and a Mamba touch followed by the node's FULL
touch (an insert ending at a node with a state).  Pure; iterates only sorted
collections.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvstate import events as ev
from kvstate.checking.scopes import MAMBA_KINDS, SWA_KINDS, Scope
from kvstate.state import DETACHED, ROOT

HYBRID_KINDS = frozenset(SWA_KINDS + MAMBA_KINDS)


def _outside_tree(state: Any) -> list[int]:
    return sorted(p for p in state.holders.keys() if p not in state.page_node)


def hybrid_candidates(state: Any, scope: Scope) -> Iterator[ev.Event]:
    kinds = set(scope.kinds)
    clock = state.clock + 1
    node_ids = sorted(n for n in state.nodes.keys() if n != ROOT)
    if state.swa is not None:
        yield from _swa(state, kinds, node_ids, clock)
    if state.mamba is not None:
        yield from _mamba(state, kinds, node_ids, clock)


def _owned_paired(state: Any, owner: Any) -> list[int]:
    peer = state.swa.peer
    return [p for p in _outside_tree(state) if p in peer and state.holders.get(p) == (owner,)]


def _swa(state: Any, kinds: set[str], node_ids: list[int], clock: int) -> Iterator[ev.Event]:
    pool = state.swa
    peer = pool.peer
    free_swa = list(pool.free_pages.head(1))
    held = sorted(state.holders.keys())
    if "swa_alloc" in kinds:
        for full in held:
            for page in free_swa:
                yield ev.SwaAlloc(((full, page),))
        taken = sorted(peer.values())[:1]
        unpaired = [p for p in _outside_tree(state) if p not in peer][:1]
        for full in unpaired:
            for page in taken:
                yield ev.SwaAlloc(((full, page),))  # an SWA page that is not free
    paired = sorted(peer.keys())
    if "swa_free" in kinds:
        for full in paired:  # a tree page's peer must be refused
            yield ev.SwaFree((full,), False)
    nodes = state.nodes
    if "swa_evict" in kinds:
        for node_id in node_ids:
            yield ev.SwaEvict((node_id,), False)
    if "swa_publish" in kinds:
        for node_id in node_ids:
            if not nodes[node_id].swa.live:
                yield ev.SwaPublish(node_id, clock)
    if "swa_touch" in kinds:
        for node_id in node_ids:
            yield ev.SwaTouch((node_id,), clock)
            parent = nodes[node_id].parent
            if parent != ROOT:
                yield ev.SwaTouch((node_id, parent), clock)
    if "swa_lock" in kinds:
        for node_id in node_ids:
            yield ev.SwaLock(node_id, 0, 0)
            receipt = nodes[node_id].swa.uuid or pool.next_uuid
            yield ev.SwaLock(node_id, node_id, receipt)
    if "swa_unlock" in kinds:
        for node_id in node_ids:
            yield ev.SwaUnlock(node_id, 0)
            receipts = sorted({nodes[n].swa.uuid for n in state.path_to_root(node_id)
                               if n != ROOT and nodes[n].swa.uuid})
            for receipt in receipts:
                yield ev.SwaUnlock(node_id, receipt)
    tombstones = [n for n in node_ids if not nodes[n].swa.live]
    if "swa_adopt" in kinds:
        owners: list[Any] = [DETACHED] + sorted(state.requests.keys(), key=str)
        for node_id in tombstones:
            count = len(nodes[node_id].pages)
            for owner in owners:
                pages = _owned_paired(state, owner)
                if len(pages) >= count:
                    yield ev.SwaAdopt(node_id, tuple(pages[:count]), owner, clock, False)
    if "swa_rebind" in kinds:
        outside = [p for p in _outside_tree(state) if p in peer]
        for node_id in tombstones:
            count = len(nodes[node_id].pages)
            if len(outside) >= count:
                yield ev.SwaRebind(node_id, tuple(outside[:count]), clock)


def _mamba(state: Any, kinds: set[str], node_ids: list[int], clock: int) -> Iterator[ev.Event]:
    tier = state.mamba
    held = sorted(tier.held.keys())
    detached = [s for s in held if tier.held[s] == DETACHED]
    states = sorted(tier.slot_node.keys())
    if "mamba_alloc" in kinds:
        for slot in tier.free_slots.head(1):
            yield ev.MambaAlloc((slot,))
        for slot in held[:1]:
            yield ev.MambaAlloc((slot,))  # a held slot must be refused
    requests = sorted(state.requests.keys(), key=str)
    if "mamba_bind" in kinds:
        for rid in requests:
            if rid in tier.rows:
                continue
            for slot in detached:
                yield ev.MambaBind(rid, (slot,))
            if len(detached) >= 2:
                yield ev.MambaBind(rid, (detached[0], detached[1]))  # a track slot
    if "mamba_free" in kinds:
        for slot in held:
            yield ev.MambaFree((slot,))
    if "mamba_donate" in kinds:
        for rid in sorted(tier.rows.keys(), key=str):
            entries = tier.rows[rid]
            for index in range(1, len(entries)):
                for fresh in detached:
                    yield ev.MambaDonate(rid, index, fresh)
    if "mamba_copy" in kinds:
        for src in sorted(set(states) | set(held)):
            for dst in held:
                if dst != src:
                    yield ev.MambaCopy(src, dst)
    records = tier.nodes
    if "mamba_commit" in kinds:
        for node_id in node_ids:
            if records.get(node_id) is None or not records[node_id].slot:
                for slot in held:
                    yield ev.MambaCommit(node_id, slot, clock)
    for node_id in node_ids:
        has_state = records.get(node_id) is not None and records[node_id].slot != 0
        if "mamba_touch" in kinds and has_state:
            yield ev.MambaTouch(node_id, clock)
        if "mamba_lock" in kinds:
            yield ev.MambaLock(node_id)
        if "mamba_unlock" in kinds:
            yield ev.MambaUnlock(node_id)
        if "mamba_evict" in kinds:
            yield ev.MambaEvict((node_id,))


def cascade_steps(state: Any, scope: Scope) -> Iterator[tuple[ev.Event, ...]]:
    """Two-event steps: a leaf losing its SWA or Mamba component and then leaving the tree;
    a Mamba touch and then the node's FULL touch."""
    kinds = set(scope.kinds)
    clock = state.clock + 1
    for node_id in sorted(n for n in state.nodes.keys() if n != ROOT):
        node = state.nodes[node_id]
        leaf = not node.children and node.lock_ref == 0
        if state.swa is not None and "swa_evict" in kinds and leaf and node.swa.live:
            yield ev.SwaEvict((node_id,), False), ev.Evict((node_id,), False)
        if state.mamba is None:
            continue
        record = state.mamba.nodes.get(node_id)
        if record is None or not record.slot:
            continue
        if "mamba_evict" in kinds and leaf and not record.lock_ref:
            yield ev.MambaEvict((node_id,)), ev.Evict((node_id,), False)
        if "mamba_touch" in kinds:
            yield ev.MambaTouch(node_id, clock), ev.Touch((node_id,), clock)
