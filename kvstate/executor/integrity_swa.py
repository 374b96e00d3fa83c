"""Integrity mode for the SWA layers of a FULL + SWA hybrid: what each SWA slot must hold.

``SwaMonitor`` is the SWA part of an :class:`~kvstate.executor.integrity.IntegrityMonitor`
whose executor has an SWA pool (:class:`~kvstate.executor.swa_executor.SwaTorchExecutor`).
It follows the same index plans, after the FULL bookkeeping, and keeps::

    peer[full page]     the SWA page the plans paired it with (independent of the executor's
                        mapping tensor, which is what gets checked against it)
    owner[swa page]     the FULL page it serves
    bound[full slot]    the Content the SWA slot of that FULL slot must hold: set when a
                        forward pass writes the slot, moved by ``SwaRebind`` and ``Copy``,
                        dropped when the page loses its SWA page or is freed
    content[swa slot]   what the SWA bytes are (absent: garbage, never written or freed)

Every tag write of the FULL side (a forward pass's write of FULL slot ``s``)
writes the SWA layers at ``full_to_swa_index_mapping[s]`` too (the
executor's, or the front end's registered one; one tag computation for
both pools): a mapping that disagrees with the pairing is reported at once
and the tags land where it says, as a kernel's would.

What is checked (:mod:`kvstate.executor.integrity_swa_check`): every live
request entry and every tree token whose FULL page has an SWA page reads,
at that SWA page, bytes computed for its position (``bound``); and, when the
window ``W`` is known, every position of a request's last ``W`` must have
one.  Positions before the window are legitimately gone.

A decision in progress (:mod:`kvstate.executor.integrity_swa_decision`):
SWA freed under a row's window is *pending* until the decision ends (the
FULL pages are freed next), and tokens computed before their page was
paired (one decode decision allocates straight into the row, then pairs)
get their SWA tags when the pairing arrives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.executor.index_plan import IndexPlan, TokenRef
from kvstate.executor.integrity_swa_decision import SwaDecision
from kvstate.executor.integrity_tags import Content, TagLayout


def swa_layout(executor: Any) -> TagLayout:
    """The tag planes of ``executor``'s SWA pool: layers after the full group's, K then V."""
    pool = executor.swa_pool
    first = executor.layer_num
    layers = range(first, first + pool.layer_num)
    tensors = list(pool.page_views.tensors)
    if len(tensors) == 1:
        planes = [[(layer, 0) for layer in layers] + [(layer, 1) for layer in layers]]
    else:
        planes = [[(layer, 0) for layer in layers], [(layer, 1) for layer in layers]]
    return TagLayout(tensors, planes, pool.page_size)


class SwaMonitor(SwaDecision):
    """The SWA bookkeeping of one integrity monitor (owns plain dicts and sets only)."""

    def __init__(self, monitor: Any, executor: Any, state: Any, *, replayed: bool = False) -> None:
        super().__init__()
        self.monitor = monitor
        self.executor = executor
        self.size = executor.page_size
        self.window: int | None = executor.window
        self.replayed = replayed
        self.layout = swa_layout(executor)
        self.layers = executor.swa_pool.layer_num
        # Tag planes number the SWA layers after the full group's; messages name model layers.
        self.model_layers = {executor.layer_num + index: layer for index, layer
                             in enumerate(executor.hybrid_config.swa_layers)}
        self.peer: dict[int, int] = {}
        self.owner: dict[int, int] = {}
        self.bound: dict[int, Content] = {}
        self.content: dict[int, Content] = {}
        self.clear_dirty()
        self._seed(state)

    def clear_dirty(self) -> None:
        self.pages: set[int] = set()  # FULL pages whose SWA readers must be looked at
        self.tokens: list[TokenRef] = []  # request entries (re)mapped since the last check
        self.rewindow: set[Any] = set()  # requests whose window moved back (truncated)
        self.moved: set[int] = set()  # SWA slots the executor moved bytes onto (or poisoned)
        self.freed: set[int] = set()  # SWA slots freed since the last check

    @property
    def dirty(self) -> bool:
        return bool(self.pages or self.tokens or self.rewindow or self.moved)

    def _seed(self, state: Any) -> None:
        """Tag the SWA pages a non-empty starting state already pairs (as if freshly written)."""
        size = self.size
        slots: list[int] = []
        contents: list[Content] = []
        for full, page in state.swa.peer.items():
            self._pair(full, page)
            for offset in range(size):
                content = self.monitor.linked_content(full * size + offset)
                if content is not None:
                    slots.append(full * size + offset)
                    contents.append(content)
        self.write(slots, contents)

    # -- following plans ---------------------------------------------------------------
    def on_plan(self, event: Any, plan: IndexPlan) -> None:
        """Update the SWA bookkeeping for one event (after the FULL side took it in; the
        monitor called ``before_plan`` before it)."""
        if plan.touches_swa:
            self._pairing(plan)
        if plan.freed_slots or plan.copy_src:
            self._full_moves(plan)
        # New tokens were written with the FULL tags (``write``), which flags their pages when
        # the write went wrong (no SWA page, a mapping that disagrees); copied ones are
        # flagged by the copy.  Linked entries read bytes already there: they are checked.
        if plan.linked_tokens:
            self.tokens.extend(plan.linked_tokens)
        for node_id, _depth, slots in plan.inserted:
            self._received(node_id, slots, strict=False)
        size = self.size
        for node_id in plan.swa_live_nodes:  # adopted, rebound or published
            pages = self.monitor.node_pages.get(node_id, ())
            self._received(node_id, [page * size + k for page in pages for k in range(size)],
                           strict=True)
        for request_id, _length in plan.truncated:
            self.rewindow.add(request_id)

    def _pairing(self, plan: IndexPlan) -> None:
        size, bound = self.size, self.bound
        for source, target in plan.swa_moved:  # the KV on the SWA page moves with it
            for offset in range(size):
                content = bound.pop(source * size + offset, None)
                if content is None:
                    bound.pop(target * size + offset, None)
                else:
                    bound[target * size + offset] = content
        readers, tree_page = self.monitor.readers, self.monitor.tree_page
        for full in plan.swa_unpaired:
            page = self.peer.pop(full, None)
            if page is not None and self.owner.get(page) == full:
                del self.owner[page]
            for offset in range(size):
                bound.pop(full * size + offset, None)
            mapped = readers.get(full)
            if mapped is not None and self._in_window(full, mapped):
                self.pending.add(full)  # nothing else to look at: no SWA left to read there
        for full, page in plan.swa_paired:
            self._pair(full, page)
            self.paired(full)
            if full in readers or full in tree_page:
                self.pages.add(full)
        if plan.swa_freed_slots:
            held = self.content
            for slot in plan.swa_freed_slots:
                held.pop(slot, None)
            self.freed.update(plan.swa_freed_slots)
            self.moved.update(plan.swa_freed_slots)
        if plan.swa_copy_src:
            self._swa_copy(plan.swa_copy_src, plan.swa_copy_dst)

    def _in_window(self, full: int, mapped: dict[Any, int]) -> bool:
        """Whether a request reads FULL page ``full`` (its table index in ``mapped``)
        inside its last window."""
        window = self.window
        if window is None:
            return False
        req_content, size = self.monitor.req_content, self.size
        return any((index + 1) * size > len(req_content[request_id]) - window
                   for request_id, index in mapped.items())

    def _pair(self, full: int, page: int) -> None:
        self.peer[full] = page
        self.owner[page] = full

    def _swa_copy(self, src: Sequence[int], dst: Sequence[int]) -> None:
        content = self.content
        for source, target in zip(src, dst, strict=True):
            known = content.get(source)
            if known is None:
                content.pop(target, None)
            else:
                content[target] = known
        self.moved.update(dst)
        size = self.size
        self.pages.update(self.owner[slot // size] for slot in dst[::size]
                          if slot // size in self.owner)

    def _full_moves(self, plan: IndexPlan) -> None:
        """A FULL copy carries the SWA expectation along when both pages have SWA pages
        (the plan copied those too); a FULL free drops it."""
        bound, peer, size = self.bound, self.peer, self.size
        for source, target in zip(plan.copy_src, plan.copy_dst, strict=True):
            known = bound.get(source)
            if known is not None and source // size in peer and target // size in peer:
                bound[target] = known
            else:
                bound.pop(target, None)
            if target // size in peer:
                self.pages.add(target // size)  # its readers read the copied SWA (or none)
        for slot in plan.freed_slots:
            bound.pop(slot, None)

    def _received(self, node_id: int, slots: Sequence[int], *, strict: bool) -> None:
        """A tree node's paired pages hold its tokens' SWA KV.  SWA KV nobody computed (a
        bare allocation's) is what the tree received: it gets fresh tags, as the FULL side's
        do.  KV computed for another position is re-tagged for an insert (as the FULL side
        does) and left to be reported with ``strict`` (an adopt, a rebind, a publish)."""
        tokens = self.monitor.node_content.get(node_id)
        if tokens is None:
            return
        bound, peer, size = self.bound, self.peer, self.size
        fresh_slots: list[int] = []
        fresh: list[Content] = []
        for index, slot in enumerate(slots):
            if slot // size not in peer:
                continue
            content = tokens[index]
            known = bound.get(slot)
            if known is None or (known[1] != content[1] and not strict):
                fresh_slots.append(slot)
                fresh.append(content)
        self.write(fresh_slots, fresh)
        self.pages.update(slot // size for slot in slots[::size] if slot // size in peer)

    def write(self, full_slots: Sequence[int], contents: Sequence[Content],
              full_layout: TagLayout | None = None) -> None:
        """A forward pass's write of ``full_slots``: the SWA tags of ``contents`` go where the
        executor's ``full_to_swa_index_mapping`` sends them (a mapping that disagrees with
        the pairing is reported; an unpaired slot writes the padding sink, slot 0), and,
        given ``full_layout``, the FULL tags at ``full_slots`` (both computed at once).

        Through a live front end's registered mapping, which it fills after its decision,
        the SWA part waits for the decision's end (``awaiting``: the forward pass runs then).
        """
        if not full_slots:
            return
        if self.lagging:
            if full_layout is not None:
                full_layout.write(full_slots, contents)
            size = self.size
            for slot, known in zip(full_slots, contents, strict=True):
                self.defer(slot // size, slot, known)
            return
        self.write_now(full_slots, contents, full_layout)

    def write_now(self, full_slots: Sequence[int], contents: Sequence[Content],
                  full_layout: TagLayout | None = None) -> None:
        """``write`` at once, through the mapping as it is now."""
        targets = self.executor.translate(full_slots)
        size, peer, bound, content = self.size, self.peer, self.bound, self.content
        readers, tree_page = self.monitor.readers, self.monitor.tree_page
        rows = self.executor.swa_pool.rows
        for number, (slot, known, target) in enumerate(zip(full_slots, contents, targets,
                                                           strict=True)):
            full = slot // size
            page = peer.get(full)
            truth = page * size + slot % size if page is not None else 0
            if target != truth:
                self.monitor.errors.append(
                    f"full_to_swa_index_mapping sends FULL slot {slot} to SWA slot {target}; "
                    f"the pairing says {truth}")
                if not 0 <= target < rows:  # outside the pool: nothing lands anywhere
                    target = targets[number] = 0
                struck = self.owner.get(target // size)
                if struck is not None:
                    self.pages.add(struck)  # its readers now read another token's bytes
                self.pages.add(full)  # and its own readers miss these
            if page is None:
                bound.pop(slot, None)
                self.pages.add(full)  # computed with no SWA page: lost if inside a window,
                self.defer(full, slot, known)  # unless the decision pairs the page next
            else:
                bound[slot] = known
                mapped = readers.get(full)
                if (mapped is not None and len(mapped) > 1) or full in tree_page:
                    self.pages.add(full)  # someone other than the writer reads it
            if target >= size:
                content[target] = known
                self.moved.discard(target)
        if full_layout is None:
            self.layout.write(targets, contents)
        else:
            full_layout.write_with(full_slots, self.layout, targets, contents)
