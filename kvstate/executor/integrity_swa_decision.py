"""The SWA monitor's view of a decision in progress: pending frees and writes awaiting a pairing.

``SwaDecision`` is the base of :class:`~kvstate.executor.integrity_swa.SwaMonitor`.
A front-end decision is a batch of events, and the forward pass that writes
KV runs after the whole decision; the monitor, though, hears each event as it
commits.  Two things are therefore not final until the decision ends:

* ``pending``: FULL pages that lost their SWA page while a row still reads
  them inside its window.  Legitimate only as the first half of freeing the
  FULL pages too (SGLang's ``free`` releases SWA, then FULL; ``SwaRebind``
  frees the request's FULL copies next).  ``confirm`` makes them final: their
  rows lost window tokens if they still read them.
* ``awaiting``: tokens whose SWA write waits: computed on a FULL page that
  had no SWA page yet (``Allocate`` with items straight into a row, then
  ``SwaAlloc`` pairing the page, as one decode decision does), or, through a
  live front end's registered mapping, every token its decision computes
  (the front end fills the mapping after the decision).  The SWA layers
  write them when the forward pass runs: :meth:`SwaDecision.resolve` writes
  their SWA tags once the page is paired, through the mapping a kernel
  would use; a page still unpaired when the decision is over is lost.

When a decision ends: a live front end's batch ends (``end_batch``; its
``full_to_swa_index_mapping`` is filled after the batch, so awaiting writes
are resolved before the next batch is planned, ``between_decisions``, or at
the next check); a replayed log records
no batch boundaries (``replayed``), so a pending free ends at the next
planned event other than a free, an awaiting write at the next one other
than an ``SwaAlloc`` (which resolves it at once: the executor's own mapping
is current then).  Owns two plain containers; mutates the monitor's
``pages`` (what the next check reads) and, through ``write``, the SWA tags.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.events import Free, FreeMapped, SwaAlloc, SwaFree
from kvstate.executor.integrity_tags import Content

FREES = (SwaFree, Free, FreeMapped)  # the events of one front-end free call


class SwaDecision:
    """Pending SWA frees and SWA writes awaiting their page's pairing (see the module)."""

    monitor: Any  # the IntegrityMonitor: ``slot_content`` (what each FULL slot holds)
    executor: Any  # the SWA executor: ``mapping_registered``
    replayed: bool
    peer: dict[int, int]
    pages: set[int]

    def __init__(self) -> None:
        self.pending: set[int] = set()
        self.awaiting: dict[int, list[tuple[int, Content]]] = {}

    def write_now(self, full_slots: Sequence[int], contents: Sequence[Content],
                  full_layout: Any = None) -> None:
        raise NotImplementedError

    @property
    def lagging(self) -> bool:
        """Whether kernels translate through a live front end's mapping, filled after its
        decision: the SWA writes of a decision then wait for its end (``awaiting``)."""
        return not self.replayed and bool(self.executor.mapping_registered)

    def in_flight(self, full: int) -> bool:
        """Whether FULL page ``full``'s missing SWA page may still be legitimate (the decision
        that frees or pairs it is not over)."""
        return full in self.pending or full in self.awaiting

    def defer(self, full: int, slot: int, content: Content) -> None:
        """A forward pass computed ``slot`` (on FULL page ``full``); its SWA write waits for
        the page's pairing or the decision's end (see ``awaiting``)."""
        self.awaiting.setdefault(full, []).append((slot, content))

    def before_plan(self, event: Any) -> None:
        """A planned event of a replayed log arrives: what it ends of the decision."""
        if self.replayed:
            if self.awaiting and not isinstance(event, SwaAlloc):
                self.flush(final=True)
            if self.pending and not isinstance(event, FREES):
                self.confirm()

    def between_decisions(self) -> None:
        """A live engine's next batch is about to be planned: the last decision's forward
        pass ran, through the mapping its front end filled (the next decision has changed
        nothing yet).  The executor calls this; so does every check."""
        if self.awaiting and not self.replayed:
            self.flush(final=True)

    def paired(self, full: int) -> None:
        """``full`` just got an SWA page; a replayed log's awaiting writes land now."""
        if self.replayed and full in self.awaiting:
            self.resolve([full])

    def flush(self, final: bool) -> None:
        """Resolve the awaiting writes whose pages are paired; with ``final`` forget the rest
        (their pages stay flagged: a row reading one inside its window lost it)."""
        ready = [full for full in self.awaiting if full in self.peer]
        if ready:
            self.resolve(ready)
        if final and self.awaiting:
            self.pages.update(self.awaiting)  # computed with no SWA page: checked as lost
            self.awaiting.clear()

    def resolve(self, pages: Sequence[int]) -> None:
        """The forward pass's SWA writes of the awaiting tokens on ``pages`` (now paired):
        those whose FULL slot still holds what was computed there."""
        slot_content = self.monitor.slot_content
        slots: list[int] = []
        contents: list[Content] = []
        for full in pages:
            for slot, content in self.awaiting.pop(full, ()):
                if slot_content.get(slot) == content:
                    slots.append(slot)
                    contents.append(content)
        self.write_now(slots, contents)

    def confirm(self) -> None:
        """Pending SWA frees are final: rows that still read them lost window tokens."""
        self.pages |= self.pending
        self.pending.clear()

    def end_batch(self) -> None:
        """A live front end's decision is whole (its mapping is filled next)."""
        if not self.replayed and self.pending:
            self.confirm()


__all__ = ["FREES", "SwaDecision"]
