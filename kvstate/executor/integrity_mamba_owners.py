"""Who holds each Mamba state slot, as the index plans say: ``MambaOwners``.

The base of :class:`~kvstate.executor.integrity_mamba.MambaMonitor`: owner
bookkeeping built from the plans alone (independent of the core state,
which the checks compare it with), and the Mamba monitor's dirty sets.
Owns plain dicts and sets only::

    held[slot]       the row holding it, or DETACHED (between owners); absent: free or a state
    rows[row]        the row's entries: running slot, then track slots (0: empty)
    slot_node[slot]  the tree node whose state it is (``node_slot`` is its inverse)
    bound            open rows that were given Mamba slots (one that computes tokens after
                     its running slot left it is reported)

A plan that disagrees with this bookkeeping (a slot taken that is not free,
bound that is not DETACHED, a donation of another slot) is reported as an
error: the planner and the rules then disagree.
"""

from __future__ import annotations

from typing import Any

from kvstate.executor.integrity_tags import Content
from kvstate.state import DETACHED, RequestId


class MambaOwners:
    """Owner bookkeeping and dirty sets of one Mamba monitor."""

    monitor: Any  # the IntegrityMonitor: request incarnations (``uid_of``), ``errors``
    expect: dict[int, Content]

    def __init__(self) -> None:
        self.held: dict[int, RequestId] = {}
        self.rows: dict[RequestId, list[int]] = {}
        self.slot_node: dict[int, int] = {}
        self.node_slot: dict[int, int] = {}
        self.bound: set[RequestId] = set()
        self.clear_dirty()

    def clear_dirty(self) -> None:
        """Forget the changes (after a check read them)."""
        self.moved: set[int] = set()  # slots whose bytes the executor moved (copied, poisoned)
        self.changed: set[int] = set()  # slots whose expectation or content may now differ
        self.reowned: set[int] = set()  # slots whose owner changed
        self.rows_touched: set[RequestId] = set()  # rows whose entries changed

    @property
    def dirty(self) -> bool:
        return bool(self.moved or self.changed or self.reowned or self.rows_touched)

    @property
    def errors(self) -> list[str]:
        return self.monitor.errors  # type: ignore[no-any-return]

    def owner(self, slot: int) -> str:
        """The slot's owner in words (for messages)."""
        node = self.slot_node.get(slot)
        if node is not None:
            return f"the state of tree node {node}"
        holder = self.held.get(slot, None)
        if holder is None:
            return "free"
        if holder == DETACHED:
            return "held DETACHED"
        entries = self.rows.get(holder, ())
        if entries and entries[0] == slot:
            return f"row {holder!r}'s running state"
        return f"row {holder!r}'s track slot"

    # -- owners changing ---------------------------------------------------------------------
    def _take(self, slot: int) -> None:
        """``MambaAlloc``: a free slot is held DETACHED; it holds no state anyone relies on."""
        if slot in self.held or slot in self.slot_node:
            self.errors.append(f"MambaAlloc takes Mamba slot {slot}, which is {self.owner(slot)}")
        self.held[slot] = DETACHED
        self.expect.pop(slot, None)
        self.reowned.add(slot)

    def _bind(self, row: RequestId, entries: tuple[int, ...]) -> None:
        if row not in self.monitor.uid_of:
            self.errors.append(f"Mamba slots {list(entries)} bound to row {row!r}, which is not open")
        for slot in entries:
            if slot:
                if self.held.get(slot, None) != DETACHED:
                    self.errors.append(f"Mamba slot {slot} bound to row {row!r} is "
                                       f"{self.owner(slot)}, not DETACHED")
                self.held[slot] = row
                self.reowned.add(slot)
        self.rows[row] = list(entries)
        self.bound.add(row)
        self.rows_touched.add(row)

    def _donate(self, row: RequestId, index: int, old: int, fresh: int) -> None:
        """The track slot ``old`` leaves the row DETACHED with its checkpoint; ``fresh`` enters."""
        entries = self.rows.get(row)
        if entries is None or entries[index] != old:
            self.errors.append(f"MambaDonate: row {row!r} entry {index} is "
                               f"{None if entries is None else entries[index]} to the monitor, "
                               f"{old} to the state")
            return
        entries[index] = fresh
        self.held[fresh], self.held[old] = row, DETACHED
        self.reowned.update((old, fresh))
        self.rows_touched.add(row)

    def _to_node(self, node: int, slot: int) -> None:
        """``MambaCommit``: the held slot becomes the node's state (its row entry empties)."""
        holder = self.held.pop(slot, None)
        if holder is None:
            self.errors.append(f"tree node {node} takes Mamba slot {slot}, which is "
                               f"{self.owner(slot)}, not held")
        elif holder != DETACHED:
            self._drop_entry(holder, slot)
        self.slot_node[slot], self.node_slot[node] = node, slot
        self.reowned.add(slot)

    def _unown(self, slot: int) -> None:
        """The slot goes back free, from a node or a holder."""
        node = self.slot_node.pop(slot, None)
        if node is not None:
            self.node_slot.pop(node, None)
        else:
            holder = self.held.pop(slot, None)
            if holder is None:
                self.errors.append(f"Mamba slot {slot} freed, but it is free already")
            elif holder != DETACHED:
                self._drop_entry(holder, slot)
        self.reowned.add(slot)

    def _release(self, row: RequestId) -> None:
        """A closing row's slots become DETACHED, states and all."""
        self.bound.discard(row)
        for slot in self.rows.pop(row, ()):
            if slot:
                self.held[slot] = DETACHED
                self.reowned.add(slot)

    def _drop_entry(self, row: RequestId, slot: int) -> None:
        entries = self.rows.get(row)
        if entries is None or slot not in entries:
            self.errors.append(f"Mamba slot {slot} leaves row {row!r}, which does not list it")
            return
        entries[entries.index(slot)] = 0
        if not any(entries):
            del self.rows[row]
        self.rows_touched.add(row)


__all__ = ["MambaOwners"]
