"""The Mamba pool's named invariants, checked only where events changed a live state.

``MambaShadow`` (owned by ``IncrementalChecker``) keeps what the rules never
see: each slot's holder as last checked and each row's slots (its reverse),
each state's stamp and the nodes sharing a stamp, and the evictable /
protected counts.  ``check(touched)`` re-checks the slots whose owner changed
(``Touched.mamba_slots``), the rows holding them before or after, the nodes
the rules reported and the closed requests, plus the pool's global sums, in
time proportional to the change; ``kvstate.invariants.mamba`` stays the
definition (the tests run both on every event of seeded runs).  Never writes
the live state.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvstate.invariants.mamba import node_problems, row_problems
from kvstate.invariants.registry import Violation
from kvstate.rules.store import Touched
from kvstate.state import DETACHED

_NODE_CHECKS = ("mamba_node_states", "mamba_full_covers_lock", "mamba_hit_has_state")


class MambaShadow:
    def __init__(self, live: Any) -> None:
        self.live = live
        self.rebuild()

    def rebuild(self) -> None:
        tier = self.live.mamba
        self.held: dict[int, Any] = dict(tier.held.items())
        self.by_row: dict[Any, set[int]] = {}
        for slot, holder in self.held.items():
            if holder != DETACHED:
                self.by_row.setdefault(holder, set()).add(slot)
        self.entry: dict[int, tuple[int, bool]] = {}  # node -> (stamp, locked), states only
        self.by_stamp: dict[int, set[int]] = {}
        self.evictable = self.protected = 0
        for node_id, component in tier.nodes.items():
            self._node(node_id, component)

    def _node(self, node_id: int, component: Any) -> None:
        old = self.entry.pop(node_id, None)
        if old is not None:
            group = self.by_stamp[old[0]]
            group.discard(node_id)
            if not group:
                del self.by_stamp[old[0]]
            if old[1]:
                self.protected -= 1
            else:
                self.evictable -= 1
        if component is None or not component.slot:
            return
        locked = component.lock_ref > 0
        self.entry[node_id] = (component.stamp, locked)
        self.by_stamp.setdefault(component.stamp, set()).add(node_id)
        if locked:
            self.protected += 1
        else:
            self.evictable += 1

    def _slot(self, slot: int) -> set[Any]:
        """Re-shadow one slot's holder; the rows it left or joined."""
        rows: set[Any] = set()
        old = self.held.pop(slot, None)
        if old is not None and old != DETACHED:
            owned = self.by_row[old]
            owned.discard(slot)
            if not owned:
                del self.by_row[old]
            rows.add(old)
        new = self.live.mamba.held.get(slot)
        if new is not None:
            self.held[slot] = new
            if new != DETACHED:
                self.by_row.setdefault(new, set()).add(slot)
                rows.add(new)
        return rows

    def check(self, touched: Touched) -> list[Violation]:
        live, tier = self.live, self.live.mamba
        found: list[Violation] = []
        rows: set[Any] = set(touched.requests)
        for slot in touched.mamba_slots:
            rows |= self._slot(slot)
        for slot in touched.mamba_slots:
            found.extend(self._check_slot(slot))
        for row in rows:
            entries = tier.rows.get(row)
            if entries is not None:
                found.extend(Violation("mamba_rows", message)
                             for message in row_problems(live, row, entries))
                if self.by_row.get(row, set()) != {slot for slot in entries if slot}:
                    found.append(Violation("mamba_rows", f"row {row!r}'s entries differ from the "
                                                         "slots it holds"))
            elif self.by_row.get(row):
                found.append(Violation("mamba_rows", f"row {row!r} holds Mamba slots "
                                                     f"{sorted(self.by_row[row])} it does not list"))
        stamps: set[int] = set()
        for node_id in touched.nodes | touched.stamped | touched.locked:
            old = self.entry.get(node_id)
            if old is not None:
                stamps.add(old[0])
            component = tier.nodes.get(node_id)
            self._node(node_id, component)
            if component is None:
                continue
            stamps.add(component.stamp)
            for name in _NODE_CHECKS:
                found.extend(Violation(name, message)
                             for message in node_problems(live, node_id, component, name))
            if component.slot and not 0 < component.stamp <= live.clock:
                found.append(Violation("mamba_lru_total", f"node {node_id}'s Mamba LRU stamp "
                                                          f"{component.stamp} is off the clock"))
        for stamp in stamps:
            group = self.by_stamp.get(stamp, set())
            if len(group) > 1:
                found.append(Violation("mamba_lru_total", f"nodes {sorted(group)[:6]} share "
                                                          f"Mamba LRU stamp {stamp}"))
        found.extend(self._globals())
        return found

    def _check_slot(self, slot: int) -> Iterator[Violation]:
        tier = self.live.mamba
        owners = [where for where, present in (
            ("free", slot in tier.free_slots), ("held", slot in tier.held),
            ("a state", slot in tier.slot_node)) if present]
        if not 1 <= slot <= tier.num_slots:
            yield Violation("mamba_owned_once", f"Mamba slot {slot} is outside 1..{tier.num_slots}")
        if len(owners) != 1:
            yield Violation("mamba_owned_once", f"Mamba slot {slot} is "
                                                f"{' and '.join(owners) or 'owned by nobody'}")
        node_id = tier.slot_node.get(slot)
        if node_id is not None:
            component = tier.nodes.get(node_id)
            if component is None or component.slot != slot:
                yield Violation("mamba_node_states", f"the slot index says Mamba slot {slot} is "
                                                     f"node {node_id}'s state; it is not")

    def _globals(self) -> Iterator[Violation]:
        tier = self.live.mamba
        if len(tier.free_slots) + len(tier.held) + len(tier.slot_node) != tier.num_slots:
            yield Violation("mamba_owned_once", "Mamba slots are not partitioned into free, held "
                                                "and states")
        if (tier.evictable, tier.protected) != (self.evictable, self.protected):
            yield Violation("mamba_sizes", f"Mamba sizes say {tier.evictable}/{tier.protected}, "
                                           f"the tree has {self.evictable}/{self.protected}")
