"""The SWA pool's named invariants, checked only where events changed a live state.

``SwaShadow`` (owned by ``IncrementalChecker``) keeps what the rules never
see: the pairing it last checked (FULL page -> SWA page) and its reverse, each
live node's SWA stamp and token contribution, and the nodes sharing each
stamp.  ``check(touched)`` re-checks the FULL pages and nodes the rules
reported (``Touched``) plus the pool's global sums, in time proportional to
the change; ``kvstate.invariants.swa`` stays the definition (the tests run
both on every event of seeded runs).  Never writes the live state.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvstate.invariants.registry import Violation
from kvstate.invariants.swa import node_checks
from kvstate.rules.store import Touched
from kvstate.state import ROOT


class SwaShadow:
    def __init__(self, live: Any) -> None:
        self.live = live
        self.rebuild()

    def rebuild(self) -> None:
        pool = self.live.swa
        self.peer: dict[int, int] = dict(pool.peer.items())
        self.owner: dict[int, list[int]] = {}
        for full, page in self.peer.items():
            self.owner.setdefault(page, []).append(full)
        self.stamp: dict[int, tuple[int, int, bool]] = {}  # node -> (stamp, tokens, locked)
        self.by_stamp: dict[int, set[int]] = {}
        self.uuid: dict[int, int] = {}  # node -> its window receipt
        self.by_uuid: dict[int, set[int]] = {}
        self.evictable = self.protected = 0
        for node_id, node in self.live.nodes.items():
            self._node(node_id, node)

    def _node(self, node_id: int, node: Any) -> None:
        old_uuid = self.uuid.pop(node_id, 0)
        if old_uuid:
            self.by_uuid[old_uuid].discard(node_id)
        uuid = 0 if node is None or node.swa is None else node.swa.uuid
        if uuid:
            self.uuid[node_id] = uuid
            self.by_uuid.setdefault(uuid, set()).add(node_id)
        old = self.stamp.pop(node_id, None)
        if old is not None:
            stamp, tokens, locked = old
            group = self.by_stamp[stamp]
            group.discard(node_id)
            if not group:
                del self.by_stamp[stamp]
            if locked:
                self.protected -= tokens
            else:
                self.evictable -= tokens
        if node is None or node_id == ROOT or node.swa is None or not node.swa.live:
            return
        locked = node.swa.lock_ref > 0
        entry = (node.swa.stamp, len(node.key), locked)
        self.stamp[node_id] = entry
        self.by_stamp.setdefault(entry[0], set()).add(node_id)
        if locked:
            self.protected += entry[1]
        else:
            self.evictable += entry[1]

    def _page(self, full: int) -> None:
        old = self.peer.pop(full, None)
        if old is not None:
            fulls = self.owner[old]
            fulls.remove(full)
            if not fulls:
                del self.owner[old]
        new = self.live.swa.peer.get(full)
        if new is not None:
            self.peer[full] = new
            self.owner.setdefault(new, []).append(full)

    def check(self, touched: Touched) -> list[Violation]:
        live = self.live
        found: list[Violation] = []
        for full in touched.pages:
            self._page(full)
        for full in touched.pages:
            found.extend(self._check_page(full))
        stamps: set[int] = set()
        changed = touched.nodes | touched.stamped | touched.locked
        for node_id in changed:  # every shadow first: a split moves a receipt between two nodes
            old = self.stamp.get(node_id)
            if old is not None:
                stamps.add(old[0])
            self._node(node_id, live.nodes.get(node_id))
            if node_id in self.stamp:
                stamps.add(self.stamp[node_id][0])
        for node_id in changed:
            node = live.nodes.get(node_id)
            if node is None:
                continue
            found.extend(Violation(name, message) for name, message in
                         node_checks(live, node_id, node))
            uuid = self.uuid.get(node_id, 0)
            if uuid and (len(self.by_uuid[uuid]) > 1 or uuid >= live.swa.next_uuid):
                found.append(Violation("swa_receipts", f"window receipt {uuid} of node {node_id} "
                                                       "is shared or not yet issued"))
        for stamp in stamps:
            found.extend(self._stamp_group(stamp))
        found.extend(self._globals())
        return found

    def _check_page(self, full: int) -> Iterator[Violation]:
        live, pool = self.live, self.live.swa
        page = pool.peer.get(full)
        if page is None:
            return
        if full not in live.holders and full not in live.page_node:
            yield Violation("swa_peer_held", f"FULL page {full} is free but keeps an SWA page")
        if not 1 <= page <= pool.num_pages or page in pool.free_pages:
            yield Violation("swa_owned_once", f"SWA page {page} of FULL page {full} is free or "
                                              "out of range")
        if len(self.owner.get(page, ())) > 1:
            yield Violation("swa_owned_once", f"SWA page {page} is the peer of FULL pages "
                                              f"{sorted(self.owner[page])}")

    def _stamp_group(self, stamp: int) -> Iterator[Violation]:
        group = self.by_stamp.get(stamp, set())
        if len(group) < 2:
            return
        nodes = self.live.nodes
        deepest = max(group, key=lambda n: _depth(nodes, n))
        on_path = set()
        node_id = deepest
        while node_id != ROOT:
            on_path.add(node_id)
            node_id = nodes[node_id].parent
        if group - on_path:
            yield Violation("swa_lru_total", f"nodes {sorted(group)[:6]} share SWA LRU stamp "
                                             f"{stamp} off one root path")

    def _globals(self) -> Iterator[Violation]:
        pool = self.live.swa
        if len(pool.free_pages) + len(self.owner) != pool.num_pages or any(
                len(fulls) != 1 for fulls in self.owner.values()):
            yield Violation("swa_owned_once", "SWA pages are not partitioned into free and "
                                              "paired")
        if (pool.evictable, pool.protected) != (self.evictable, self.protected):
            yield Violation("swa_sizes", f"SWA sizes say {pool.evictable}/{pool.protected}, the "
                                         f"tree has {self.evictable}/{self.protected}")


def _depth(nodes: Any, node_id: int) -> int:
    count = 0
    while node_id != ROOT:
        count += 1
        node_id = nodes[node_id].parent
    return count
