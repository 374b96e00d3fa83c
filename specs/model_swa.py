"""Reference model of a FULL + SWA hybrid cache: the core model plus an SWA pool.

Written from the SWA event docstrings (``kvstate.events.swa``), the
invariants (``kvstate.invariants.swa``) and the FULL rules' SWA clauses
documented in ``kvstate.rules.tree`` / ``frees`` / ``rows``, never from the
rules' code.  A ``HybridModel`` is the core ``ModelState`` (stepped by
``specs.model.step``) and a ``ModelSwa``: the SWA free list in queue order,
the pairing FULL page -> SWA page, the receipt counter and each node's SWA
record ``[live, lock_ref, uuid, stamp]``.  Sizes and the LRU order are
derived by scanning.  ``step_hybrid`` returns a new model or raises
``ModelReject``; it never mutates its input.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from specs.model import step as core_step
from specs.model_state import ROOT, ModelReject, ModelState, initial_model, push, require


@dataclass
class ModelSwa:
    num_pages: int
    free: list[int]
    peer: dict[int, int] = field(default_factory=dict)
    next_uuid: int = 1
    node: dict[int, list[Any]] = field(default_factory=dict)  # [live, lock_ref, uuid, stamp]


@dataclass
class HybridModel:
    core: ModelState
    swa: ModelSwa


def initial_hybrid(num_pages: int, swa_pages: int, page_size: int = 1,
                   num_rows: int = 0) -> HybridModel:
    return HybridModel(initial_model(num_pages, page_size, num_rows),
                       ModelSwa(swa_pages, list(range(1, swa_pages + 1))))


def step_hybrid(m: HybridModel, event: Any) -> HybridModel:
    """The model after ``event`` (a core or an SWA event)."""
    out = copy.deepcopy(m)
    name = type(event).__name__
    rule = SWA_RULES.get(name)
    if rule is not None:
        rule(out, event)
        return out
    _before_core(out, name, event)
    out.core = core_step(m.core, event)
    _after_core(out, m, name, event)
    return out


# -- the FULL events' SWA clauses ---------------------------------------------------------
def _before_core(m: HybridModel, name: str, e: Any) -> None:
    core, swa = m.core, m.swa
    if name in ("Free", "FreeMapped"):
        require(not set(e.pages) & set(swa.peer), "a page with an SWA page must free it first")
    elif name == "Evict":
        require(all(not swa.node.get(n, [False])[0] for n in e.nodes),
                "only SWA tombstones are evicted")
    elif name == "Unlock" and e.node in core.nodes:
        for node_id in core.path(e.node):
            require(core.nodes[node_id].lock_ref - 1 >= swa.node[node_id][1],
                    "an SWA window lock would outlive its FULL lock")
    elif name == "Insert":
        size = core.page_size
        pages = [slot // size for slot in e.slots[::size]]
        paired = [page in swa.peer for page in pages]
        require(all(paired) or not any(paired), "a node is live or a tombstone as a whole")


def _after_core(m: HybridModel, before: HybridModel, name: str, e: Any) -> None:
    swa, core = m.swa, m.core
    if name == "Insert":
        live = core.nodes[e.node].pages[0] in swa.peer
        swa.node[e.node] = [live, 0, 0, e.time if live else 0]
    elif name == "Split":
        record = swa.node[e.node]
        swa.node[e.new_node] = list(record)  # the top half: everything, the receipt too
        record[2] = 0
    elif name == "Evict":
        for node_id in e.nodes:
            del swa.node[node_id]
    elif name == "Reset" and e.scope in ("tree", "all"):
        tree_pages = [p for n, node in before.core.nodes.items() for p in node.pages]
        swa.free = push(swa.free, sorted(swa.peer.pop(p) for p in tree_pages if p in swa.peer),
                        False)
        swa.node = {}
    if name == "Reset" and e.scope in ("pages", "all"):
        swa.free, swa.peer = list(range(1, swa.num_pages + 1)), {}


# -- the SWA events --------------------------------------------------------------------------
def _record(m: HybridModel, node_id: int) -> list[Any]:
    require(node_id != ROOT and node_id in m.core.nodes, f"no tree node {node_id}")
    return m.swa.node[node_id]


def _time(m: HybridModel, time: int) -> None:
    require(time >= m.core.clock, "time before the clock")
    m.core.clock = time


def swa_alloc(m: HybridModel, e: Any) -> None:
    fulls, pages = [f for f, _ in e.pairs], [p for _, p in e.pairs]
    require(len(set(fulls)) == len(fulls) and len(set(pages)) == len(pages), "duplicates")
    owner = m.core.tree_page_owner()
    for full, page in e.pairs:
        require(1 <= full <= m.core.num_pages and full in m.core.holders and full not in owner,
                f"FULL page {full} is not allocated outside the tree")
        require(full not in m.swa.peer, f"FULL page {full} is paired already")
        require(page in m.swa.free, f"SWA page {page} is not free")
    for full, page in e.pairs:
        m.swa.free.remove(page)
        m.swa.peer[full] = page


def swa_free(m: HybridModel, e: Any) -> None:
    require(len(set(e.pages)) == len(e.pages), "duplicates")
    owner = m.core.tree_page_owner()
    require(all(p in m.swa.peer and p not in owner for p in e.pages),
            "each page must be paired and outside the tree")
    m.swa.free = push(m.swa.free, [m.swa.peer.pop(p) for p in e.pages], e.at_head)


def swa_evict(m: HybridModel, e: Any) -> None:
    require(len(set(e.nodes)) == len(e.nodes), "duplicates")
    for node_id in e.nodes:
        live, locks, _, _ = _record(m, node_id)
        require(live and locks == 0, f"node {node_id} is not a live, window-unlocked node")
    for node_id in e.nodes:
        pages = m.core.nodes[node_id].pages
        m.swa.free = push(m.swa.free, [m.swa.peer.pop(p) for p in pages], e.at_head)
        record = m.swa.node[node_id]
        record[0], record[3] = False, 0


def swa_publish(m: HybridModel, e: Any) -> None:
    record = _record(m, e.node)
    require(not record[0], "already live")
    require(all(p in m.swa.peer for p in m.core.nodes[e.node].pages), "a page has no SWA page")
    _time(m, e.time)
    record[0], record[3] = True, e.time


def swa_touch(m: HybridModel, e: Any) -> None:
    require(len(e.nodes) > 0 and len(set(e.nodes)) == len(e.nodes), "no node, or twice")
    for index, node_id in enumerate(e.nodes):
        require(_record(m, node_id)[0], f"node {node_id} is a tombstone")
        if index:
            require(node_id in m.core.path(e.nodes[index - 1])[1:], "not an ancestor chain")
    _time(m, e.time)
    for node_id in e.nodes:
        m.swa.node[node_id][3] = e.time


def swa_lock(m: HybridModel, e: Any) -> None:
    path = m.core.path(e.node) if e.node in m.core.nodes else []
    require(e.node != ROOT and bool(path), "no such node")
    if e.top != ROOT:
        require(e.top in path, "top is not on the node's path")
        path = path[: path.index(e.top) + 1]
    for node_id in path:
        require(m.core.nodes[node_id].lock_ref > m.swa.node[node_id][1], "FULL must cover SWA")
        require(m.swa.node[node_id][0], "a locked window holds live SWA KV only")
    fresh = False
    if e.top == ROOT:
        require(e.uuid == 0, "a root window has no receipt")
    else:
        known = m.swa.node[e.top][2]
        fresh = known == 0
        require(e.uuid == (m.swa.next_uuid if fresh else known), "wrong receipt")
    for node_id in path:
        m.swa.node[node_id][1] += 1
    if fresh:
        m.swa.node[e.top][2] = e.uuid
        m.swa.next_uuid += 1


def swa_unlock(m: HybridModel, e: Any) -> None:
    require(e.node != ROOT and e.node in m.core.nodes, "no such node")
    path = m.core.path(e.node)
    if e.uuid:
        ends = [i for i, n in enumerate(path) if m.swa.node[n][2] == e.uuid]
        require(bool(ends), "receipt not on the path")
        path = path[: ends[0] + 1]
    require(all(m.swa.node[n][1] > 0 for n in path), "SWA unlock below zero")
    for node_id in path:
        m.swa.node[node_id][1] -= 1


def _recovery(m: HybridModel, node_id: int, pages: tuple[int, ...]) -> list[Any]:
    record = _record(m, node_id)
    node = m.core.nodes[node_id]
    owner = m.core.tree_page_owner()
    require(not record[0], "not a tombstone")
    require(len(pages) == len(node.pages) and len(set(pages)) == len(pages), "page count")
    require(all(p in m.swa.peer and p not in owner for p in pages), "incoming pages")
    require(not any(p in m.swa.peer for p in node.pages), "a tombstone keeps no SWA page")
    return record


def swa_adopt(m: HybridModel, e: Any) -> None:
    record = _recovery(m, e.node, e.pages)
    core = m.core
    node = core.nodes[e.node]
    require(node.lock_ref == 0, "FULL-locked")
    require(all(core.holders.get(p) == {e.owner} for p in e.pages), "not the owner's alone")
    mapped = {p for r in core.requests.values() for p in r.mapped()}
    require(not any(core.held(p) or p in mapped for p in node.pages), "old pages still used")
    _time(m, e.time)
    core.free = push(core.free, list(node.pages), e.at_head)
    for page in e.pages:
        del core.holders[page]
    node.pages = list(e.pages)
    record[0], record[3] = True, e.time


def swa_rebind(m: HybridModel, e: Any) -> None:
    record = _recovery(m, e.node, e.pages)
    _time(m, e.time)
    for kept, incoming in zip(m.core.nodes[e.node].pages, e.pages, strict=True):
        m.swa.peer[kept] = m.swa.peer.pop(incoming)
    record[0], record[3] = True, e.time


SWA_RULES = {"SwaAlloc": swa_alloc, "SwaFree": swa_free, "SwaEvict": swa_evict,
             "SwaPublish": swa_publish, "SwaTouch": swa_touch, "SwaLock": swa_lock,
             "SwaUnlock": swa_unlock, "SwaAdopt": swa_adopt, "SwaRebind": swa_rebind}


def abstract_hybrid(state: Any) -> HybridModel:
    """The refinement mapping for a state with an SWA pool (frozen or live)."""
    from specs.abstraction import abstract

    pool = state.swa
    nodes = {n: [node.swa.live, node.swa.lock_ref, node.swa.uuid, node.swa.stamp]
             for n, node in state.nodes.items() if n != ROOT}
    return HybridModel(abstract(state), ModelSwa(pool.num_pages, list(pool.free_pages),
                                                 dict(pool.peer.items()), pool.next_uuid, nodes))


__all__ = ["HybridModel", "ModelReject", "ModelSwa", "abstract_hybrid", "initial_hybrid",
           "step_hybrid"]
