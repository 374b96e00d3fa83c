"""Integrity mode: the executor proves the metadata by reading back tags.

While enabled, every token a forward pass would compute gets a deterministic
tag written into its slot in every layer (:mod:`kvstate.executor.integrity_tags`),
derived from ``(writer, position, layer)``, where the writer is a request
incarnation (a request id plus a counter, since rows are reused) or, for KV
the tree received without a writing request, the inserting node.  The
monitor keeps, independently of the buffers and of the state, which tag
every live token *should* hold and who reads which page:

    request r, position p   -> the tag its own write left there, or the tag of
                               the tree / shared token it was linked to
    tree node n, token i    -> the tag of the token inserted there
    page -> readers         -> which request table entries and tree node map it

Two checks read the buffers back (both read-only):

* ``verify()`` (:mod:`kvstate.executor.integrity_verify`): every live token of
  every request through every export (``gather_kv``, the FlashInfer page
  table, vLLM's block table and slot mapping, SGLang's ``req_to_token``, an
  attached ``ReqToTokenPool``), every tree token and every host copy.
* the SWA layers of a FULL + SWA hybrid, in both checks
  (:mod:`kvstate.executor.integrity_swa`): every token whose page has SWA KV
  reads the tags of its position there, and a request's last window is whole;
* the Mamba states of a FULL + MAMBA hybrid, in both checks
  (:mod:`kvstate.executor.integrity_mamba`): every state slot holds the state
  its owner (a request row, a tree node) relies on, tagged by (writer,
  position); ``write_state`` is the forward pass's state write;
* ``check()`` (:mod:`kvstate.executor.integrity_check`): only what changed
  since the last check or verification: the tables of touched requests
  against the state's, every reader of a page whose bytes the executor moved
  (copied, loaded, freed and poisoned) or that the monitor wrote while
  someone else reads it, and new host copies.  Cost follows the events, not
  the state; ``replay_hook`` runs it every ``check_every`` events.

Two live tokens sharing a slot, a stale prefix hit, a missed copy-on-write,
a wrong copy or a page freed under a reader all show up as a token reading
someone else's tag (or a freed slot).  Linking a position to a token computed
for a different position is reported at the event.  Entries ``FreeMapped``
left dangling are not read by the checks; reading one (an export, or a
kernel-style read through :meth:`IntegrityMonitor.check_read`) is a use after free.

The monitor follows the executor's index plans (``on_plan``), mutates only
its own bookkeeping, and writes tags into the executor's buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.events import MAMBA_EVENTS, Event
from kvstate.executor.index_plan import IndexPlan, node_depth
from kvstate.executor.integrity_block import cache_blocks, null_content, seed_block_cache
from kvstate.executor.integrity_check import IntegrityReport, check_changes, check_kernel_read
from kvstate.executor.integrity_host import seed_host
from kvstate.executor.integrity_mamba import MambaMonitor
from kvstate.executor.integrity_mamba_check import check_mamba, verify_mamba
from kvstate.executor.integrity_swa import SwaMonitor
from kvstate.executor.integrity_tags import Content, TagLayout
from kvstate.executor.integrity_tags import tag_values as tag_values  # re-exported
from kvstate.executor.integrity_verify import verify_full
from kvstate.executor.integrity_writes import Writes
from kvstate.state import ROOT, RequestId, slots_of

__all__ = ["IntegrityMonitor", "IntegrityReport", "enable_integrity", "tag_values"]


class IntegrityMonitor(Writes):
    """Tag writer and checker for one executor (owns only its bookkeeping; see ``Tables``).

    Built by :func:`enable_integrity` on an executor that already follows an
    engine: it tags what the engine's state maps at that moment, then follows
    the executor's plans.
    """

    def __init__(self, executor: Any, *, request_pool: Any = None, replayed: bool = False,
                 infer_mamba_states: bool = True) -> None:
        super().__init__(executor.geometry.page_size, executor.geometry.mode == "block")
        self.executor = executor
        self.request_pool = request_pool  # optional SGLang ReqToTokenPool to read as well
        self.layout = TagLayout.of_executor(executor)
        self.next_uid = 1
        self.copied: dict[int, Content] = {}  # copy destinations not yet mapped by a request
        self.host_content: dict[int, Content] = {}  # host slot -> what its bytes are
        self.errors: list[str] = []
        self.reported = 0  # errors already returned by ``check``
        self.swa: SwaMonitor | None = None
        self.mamba: MambaMonitor | None = None
        if executor.engine is None:
            raise RuntimeError("attach the executor to an engine before enabling integrity mode "
                               "(the monitor tags what the engine's state already maps)")
        self._seed_from(executor.view)
        if getattr(executor, "swa_pool", None) is not None:  # the SWA layers of a hybrid
            self.swa = SwaMonitor(self, executor, executor.view, replayed=replayed)
        if getattr(executor, "mamba_pool", None) is not None:  # the Mamba layers' states
            self.mamba = MambaMonitor(self, executor, executor.view, infer=infer_mamba_states)
        executor.listeners.append(self.on_plan)

    def _seed_from(self, state: Any) -> None:
        """Tag what a non-empty starting state already maps (as if freshly written).

        The tree first (block mode: the cached pages, which keep no node
        record, so a request slot's content is its ``slot_content``), then
        every request table (a block-mode null entry reads the padding, a
        dangling entry stays dangling), then the host copies.
        """
        if self.block:
            seed_block_cache(self, state)
        else:
            for node_id in sorted(n for n in state.nodes.keys() if n != ROOT):
                node = state.nodes[node_id]
                slots = [page * self.size + k for page in node.pages for k in range(self.size)]
                self._insert(node_id, node_depth(state, node_id), slots)
        size = self.size
        for request_id, record in state.requests.items():
            self._open(request_id)
            dangling = set(record.dangling)
            for position, slot in enumerate(slots_of(state, request_id)):
                token = ((request_id, position, slot),)
                if position // size in dangling:  # freed under the row: not written, not read
                    self.map_tokens(token, [(0, position)])
                    self.dangle(token)
                    continue
                content = (null_content(position, size) if self.block and slot < size
                           else self.linked_content(slot))
                if content is not None and content[1] == position:
                    self.map_tokens(token, [content])
                else:
                    self._write_request_tokens(token)
        seed_host(self, state)

    # -- following events --------------------------------------------------------
    def on_plan(self, event: Event, plan: IndexPlan) -> None:
        """Update the bookkeeping for one event's plan (after the executor moved its bytes)."""
        swa = self.swa if self.swa is not None and not isinstance(event, MAMBA_EVENTS) else None
        if swa is not None:  # a Mamba event changes no SWA page, ends no decision's SWA part
            swa.before_plan(event)
        for request_id in plan.opened:
            self._open(request_id)
        if plan.copy_src:
            self._copy(plan.copy_src, plan.copy_dst)
        if plan.host_out_src:
            self._offload(plan.host_out_src, plan.host_out_dst)
        if plan.dangled_tokens:
            self.dangle(plan.dangled_tokens)
        if plan.freed_slots:
            self.free_slots(plan.freed_slots)
            for slot in plan.freed_slots:
                self.copied.pop(slot, None)
        for host_slot in plan.host_freed:
            self.host_content.pop(host_slot, None)
        if plan.host_in_src:
            self._load(plan.host_in_src, plan.host_in_dst)
        for request_id, length in plan.truncated:
            self.truncate(request_id, length)
        if plan.new_tokens:
            self._write_request_tokens(plan.new_tokens)
        if plan.linked_tokens or plan.nulled_tokens:
            self._link(plan.linked_tokens, plan.nulled_tokens)
        if plan.cached_blocks:
            cache_blocks(self, plan.cached_blocks)
        for page in plan.uncached_pages:
            self.cached.pop(page, None)
        for node_id, depth, slots in plan.inserted:
            self._insert(node_id, depth, slots)
        for node_id, at, new_node in plan.split:
            self.split_node(node_id, at, new_node)
        for node_id in plan.demoted_nodes:
            self.demote_node(node_id)
        for node_id in plan.dropped_nodes:
            self.drop_node(node_id)
        for node_id, depth, slots in plan.adopted:
            self._adopt(node_id, depth, slots)
        for node_id, slots in plan.loaded_nodes:
            if node_id not in self.node_content:
                self.errors.append(f"loaded node {node_id} has no tag record")
            else:
                self.place_node(node_id, slots)
        for request_id in plan.closed:
            self.close(request_id)
            self.uid_of.pop(request_id, None)
        if swa is not None:
            swa.on_plan(event, plan)
        if self.mamba is not None and (plan.touches_mamba or plan.closed or plan.new_tokens):
            self.mamba.on_plan(plan)

    def end_batch(self) -> None:
        """The engine's batch is whole (the executor says so after moving its bytes)."""
        if self.swa is not None:
            self.swa.end_batch()

    def settle(self) -> None:
        """No decision is half done (a replayed log ended): pending SWA frees are final, SWA
        writes awaiting a pairing land or are lost."""
        if self.swa is not None:
            self.swa.flush(final=True)
            self.swa.confirm()

    def between_decisions(self) -> None:
        """The last decision is over (the executor says so before planning a batch; every check
        first says so too): the forward pass's SWA writes awaiting it land where the front
        end's now-filled mapping sends them (a replayed log's decision may go on: only the
        writes whose pages are paired land)."""
        if self.swa is not None and self.swa.awaiting:
            self.swa.between_decisions()

    def _open(self, request_id: RequestId) -> None:
        self.open(request_id)
        self.uid_of[request_id] = self._fresh_uid()

    def write_state(self, slot: int, request: RequestId, position: int,
                    start: int | None = None) -> None:
        """A forward pass of ``request`` wrote its Mamba state after ``position`` tokens into
        ``slot`` (see :meth:`~kvstate.executor.integrity_mamba.MambaMonitor.write_state`);
        ``ValueError`` without a Mamba pool or for bad arguments (nothing changed)."""
        if self.mamba is None:
            raise ValueError("the executor holds no Mamba states")
        self.mamba.write_state(slot, request, position, start)

    # -- checking ------------------------------------------------------------------------
    def verify(self, state: Any = None) -> IntegrityReport:
        """Full check: every live token through every export, the tree, host copies (read-only)."""
        state = self.executor.view if state is None else state
        self.between_decisions()
        report = verify_full(self, state)
        return report if self.mamba is None else _with(report, verify_mamba, self.mamba, state)

    def check(self, state: Any = None) -> IntegrityReport:
        """Incremental check: only what changed since the last check or verification."""
        state = self.executor.view if state is None else state
        self.between_decisions()
        report = check_changes(self, state)
        return report if self.mamba is None else _with(report, check_mamba, self.mamba, state)

    def check_read(self, request_id: RequestId, slots: Sequence[int], start: int = 0,
                   state: Any = None) -> IntegrityReport:
        """A kernel-style read: ``slots`` (taken from some table) for positions ``start..``.

        Reports a dangling position as a use after free, a slot that is not
        the one the state maps, and bytes that are not the expected tags.
        """
        self.between_decisions()
        return check_kernel_read(self, self.executor.view if state is None else state,
                                 request_id, slots, start)


def _with(report: IntegrityReport, part: Any, mamba: MambaMonitor, state: Any) -> IntegrityReport:
    """``report`` with the Mamba states' check ``part`` added."""
    problems = list(report.problems)
    checked = report.tokens_checked + part(mamba, state, problems)
    if checked == report.tokens_checked and len(problems) == len(report.problems):
        return report
    return IntegrityReport(not problems, tuple(problems), checked)


def enable_integrity(executor: Any, *, request_pool: Any = None, replayed: bool = False,
                     infer_mamba_states: bool = True) -> IntegrityMonitor:
    """Attach a monitor to ``executor`` (tags what its state already maps); returns it.

    ``replayed``: the engine applies a log one event per batch, so a batch is
    not a whole front-end decision (this matters to the SWA window checks only:
    :mod:`kvstate.executor.integrity_swa`).  ``infer_mamba_states`` (an executor
    with Mamba states): the running states follow the rows' KV writes and a
    checkpoint the tree takes unwritten gets fresh tags; off, only
    ``write_state`` writes states (:mod:`kvstate.executor.integrity_mamba`).
    """
    monitor = IntegrityMonitor(executor, request_pool=request_pool, replayed=replayed,
                               infer_mamba_states=infer_mamba_states)
    executor.integrity = monitor
    return monitor
