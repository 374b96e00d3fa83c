"""Integrity mode for the Mamba states of a FULL + MAMBA hybrid: what each state slot must hold.

``MambaMonitor`` is the Mamba part of an :class:`~kvstate.executor.integrity.IntegrityMonitor`
whose executor has a Mamba pool (:mod:`kvstate.executor.mamba_executor`).  A
state's tag is derived from a ``Content`` ``(writer, position)``: the request
incarnation that computed it (or a fresh writer for a state the tree received
that nobody computed) and the number of tokens it has consumed.  From the
index plans alone the monitor keeps::

    held[slot]       the row holding it, or DETACHED (between owners)
    rows[row]        the row's entries: running slot, then track slots (0: empty)
    slot_node[slot]  the tree node whose state it is (and node_slot, its inverse)
    content[slot]    what the slot's bytes are (absent: garbage; POISONED: freed, poisoned)
    expect[slot]     the state its owner relies on (absent: nothing yet, a fresh slot)

States are written by a forward pass: :meth:`MambaMonitor.write_state`
(``slot, request, position, start``) writes the tags of ``(request,
position)`` where the caller's kernel writes a state (the running state, or
a ping-pong track slot's checkpoint).  With ``infer`` (the default, and what
a replayed log needs: a log records no forward pass) the monitor also
writes them where the events imply them: a row's running state advances
with every position its KV is computed for (``new_tokens``), and a state a
tree node takes that nobody wrote (a track slot's checkpoint) gets fresh
tags, as KV the tree receives does.  Without ``infer`` only ``write_state``
writes, and a state relied on but never written is reported.

Reported at once (a kernel's read, or a change of owner):

* a request resuming at position ``p`` (computing ``p..``) from a running
  slot that holds no state, the state of another position, or bytes that
  are not that state (a copy-on-match whose copy was skipped, a slot freed
  under the request and reused);
* a request computing tokens after its running slot left it;
* a request writing a slot it does not hold (a freed and reused slot, a
  track slot already donated to the tree);
* a tree node taking a state of another position than its end, a copy from
  a slot that holds no state, and plans that disagree with what the monitor
  knows (a planner bug).

The checks (:mod:`kvstate.executor.integrity_mamba_check`) read back the
bytes the executor moved (copies, poison), compare every changed slot's
expectation with its content, and compare owners with the state's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.executor.index_plan import IndexPlan, TokenRef, depth_below
from kvstate.executor.integrity_mamba_owners import MambaOwners
from kvstate.executor.integrity_mamba_tags import mamba_layout
from kvstate.executor.integrity_tags import POISON_UID, Content
from kvstate.state import RequestId

POISONED: Content = (POISON_UID, 0)  # what a freed, poisoned slot holds


class MambaMonitor(MambaOwners):
    """The Mamba bookkeeping of one integrity monitor (owns plain dicts and sets only; the
    owners are :class:`~kvstate.executor.integrity_mamba_owners.MambaOwners`')."""

    def __init__(self, monitor: Any, executor: Any, state: Any, *, infer: bool = True) -> None:
        super().__init__()
        self.monitor = monitor
        self.pool = executor.mamba_pool
        self.layout = mamba_layout(self.pool)
        self.infer = infer
        self.poison = bool(executor.poison_freed)
        self.content: dict[int, Content] = {}
        self.expect: dict[int, Content] = {}
        self._seed(state)

    def _seed(self, state: Any) -> None:
        """Tag the states a non-empty starting state already has (as if freshly written):
        each tree state as the state of its node's end, each running state as the state of
        its row's mapped tokens; track slots hold nothing known yet."""
        tier = state.mamba
        for slot, holder in tier.held.items():
            self.held[slot] = holder
        for row, entries in tier.rows.items():
            self.rows[row] = list(entries)
            self.bound.add(row)
            length = state.requests[row].allocated
            if entries[0] and length:
                self._write(entries[0], (self.monitor.uid_of[row], length))
        for slot, node in tier.slot_node.items():
            self.slot_node[slot], self.node_slot[node] = node, slot
            self._write(slot, (self.monitor._fresh_uid(), depth_below(state, node)))

    # -- following plans -------------------------------------------------------------------
    def on_plan(self, plan: IndexPlan) -> None:
        """Update the Mamba bookkeeping for one event (after the KV side took it in)."""
        for slot in plan.mamba_taken:
            self._take(slot)
        for row, entries in plan.mamba_bound:
            self._bind(row, entries)
        for row, index, old, fresh in plan.mamba_donated:
            self._donate(row, index, old, fresh)
        if plan.mamba_copy_src:
            self._copy(plan.mamba_copy_src, plan.mamba_copy_dst)
        for node, slot, position in plan.mamba_committed:
            self._commit(node, slot, position)
        if plan.mamba_freed:
            self._free(plan.mamba_freed)
        for row in plan.closed:
            self._release(row)
        if plan.new_tokens and self.infer:
            self._computed(plan.new_tokens)

    def _copy(self, sources: Sequence[int], targets: Sequence[int]) -> None:
        for src, dst in zip(sources, targets, strict=True):
            want = self.expect.get(src)
            if want is None:
                self.errors.append(f"Mamba copy from slot {src} ({self.owner(src)}) into slot "
                                   f"{dst}: the source holds no state")
                self.expect.pop(dst, None)
            else:
                self.expect[dst] = want
            known = self.content.get(src)
            if known is None:
                self.content.pop(dst, None)
            else:
                self.content[dst] = known
            self.moved.add(dst)
            self.changed.add(dst)

    def _commit(self, node: int, slot: int, position: int) -> None:
        self._to_node(node, slot)
        want = self.expect.get(slot)
        if want is None:
            if self.infer:  # a checkpoint the log does not record: the tree receives it
                self._write(slot, (self.monitor._fresh_uid(), position))
            else:
                self.errors.append(f"tree node {node} takes Mamba slot {slot} as the state of its "
                                   f"first {position} tokens, but no state was written there")
        elif want[1] != position:
            self.errors.append(f"tree node {node} takes Mamba slot {slot} as the state of its "
                               f"first {position} tokens; the slot holds the state of position "
                               f"{want[1]}")

    def _free(self, slots: Sequence[int]) -> None:
        for slot in slots:
            self._unown(slot)
            self.expect.pop(slot, None)
            if self.poison:
                self.content[slot] = POISONED
                self.moved.add(slot)
            else:
                self.content.pop(slot, None)

    def _computed(self, tokens: Sequence[TokenRef]) -> None:
        """Fresh KV positions: each row's running state advances past them (``infer``)."""
        spans: dict[RequestId, list[int]] = {}
        if len(tokens) == 1:  # a decode step
            spans[tokens[0][0]] = [tokens[0][1], tokens[0][1] + 1]
        else:
            for row, position, _slot in tokens:
                span = spans.get(row)
                if span is None:
                    spans[row] = [position, position + 1]
                else:
                    span[0], span[1] = min(span[0], position), max(span[1], position + 1)
        slots: list[int] = []
        contents: list[Content] = []
        for row, (start, stop) in spans.items():
            entries = self.rows.get(row)
            if entries is None or not entries[0]:
                if row in self.bound:
                    self.errors.append(f"request {row!r} computes positions {start}..{stop - 1} "
                                       "but holds no running Mamba state (its slot left the row)")
                continue
            self._resume(row, entries[0], start)
            slots.append(entries[0])
            contents.append((self.monitor.uid_of[row], stop))
        self._write_many(slots, contents)

    # -- states written and read ------------------------------------------------------------
    def write_state(self, slot: int, request: RequestId, position: int,
                    start: int | None = None) -> None:
        """A forward pass of ``request`` wrote its state after ``position`` tokens into ``slot``
        (its running slot: a step that resumed from ``start``, by default the position the
        slot's state has, 0 for none; a track slot: a checkpoint, nothing read).

        Raises ``ValueError`` (nothing changed) for arguments out of range or a request that
        is not open; what the write breaks is reported by the checks.
        """
        for name, value in (("slot", slot), ("position", position)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if not 1 <= slot <= self.pool.num_slots:
            raise ValueError(f"Mamba slot {slot} is outside 1..{self.pool.num_slots}")
        if start is not None and (isinstance(start, bool) or not isinstance(start, int)
                                  or not 0 <= start <= position):
            raise ValueError(f"start must be an int in 0..{position}, got {start!r}")
        uid = self.monitor.uid_of.get(request)
        if uid is None:
            raise ValueError(f"request {request!r} is not open")
        content = (uid, position)
        entries: list[int] = self.rows.get(request, [])
        if slot not in entries:
            self.errors.append(f"request {request!r} writes Mamba slot {slot}, which it does not "
                               f"hold ({self.owner(slot)})")
            self.layout.write([slot], [content])
            self.content[slot] = content
            self.changed.add(slot)
            return
        if slot == entries[0]:
            current = self.expect.get(slot)
            if current == content:
                return  # the monitor wrote this state already (``infer``)
            self._resume(request, slot, start if start is not None else
                         (0 if current is None else current[1]))
        self._write(slot, content)

    def _resume(self, row: RequestId, slot: int, start: int) -> None:
        """A step of ``row`` reads its running state in ``slot`` to compute from ``start``."""
        if start == 0:
            return  # a prefill from the first token starts from the zero state
        what = f"request {row!r} resumes at position {start} from Mamba slot {slot}"
        want = self.expect.get(slot)
        if want is None:
            self.errors.append(f"{what}, which holds no state computed for it (a copy-on-match "
                               "or a state write that never happened)")
        elif want[1] != start:
            self.errors.append(f"{what}, which holds the state of position {want[1]}")
        elif slot in self.moved:  # bytes the executor moved: the kernel reads them now
            if len(self.layout.mismatches([slot], [want])):
                self.errors.append(f"{what}: its bytes are not that state (the copy or move "
                                   "did not happen)")
            else:
                self.content[slot] = want
            self.moved.discard(slot)
        elif self.content.get(slot) != want:
            self.errors.append(f"{what}: its bytes were overwritten by another writer")

    def _write(self, slot: int, content: Content) -> None:
        """The tags of ``content`` into ``slot``, now what its owner relies on."""
        self._write_many([slot], [content])

    def _write_many(self, slots: list[int], contents: list[Content]) -> None:
        """The tags of ``contents`` into distinct ``slots`` (one computation for a batch)."""
        if not slots:
            return
        self.layout.write(slots, contents)
        for slot, content in zip(slots, contents, strict=True):
            self.content[slot] = self.expect[slot] = content
            self.moved.discard(slot)


__all__ = ["POISONED", "MambaMonitor"]
