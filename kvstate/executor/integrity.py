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

from kvstate.events import Event
from kvstate.executor.index_plan import IndexPlan, node_depth
from kvstate.executor.integrity_block import cache_blocks, null_content, seed_block_cache
from kvstate.executor.integrity_check import IntegrityReport, check_changes, check_kernel_read
from kvstate.executor.integrity_host import seed_host
from kvstate.executor.integrity_swa import SwaMonitor
from kvstate.executor.integrity_tables import Tables
from kvstate.executor.integrity_tags import Content, TagLayout
from kvstate.executor.integrity_tags import tag_values as tag_values  # re-exported
from kvstate.executor.integrity_verify import verify_full
from kvstate.state import ROOT, RequestId, slots_of

__all__ = ["IntegrityMonitor", "IntegrityReport", "enable_integrity", "tag_values"]


class IntegrityMonitor(Tables):
    """Tag writer and checker for one executor (owns only its bookkeeping; see ``Tables``).

    Built by :func:`enable_integrity` on an executor that already follows an
    engine: it tags what the engine's state maps at that moment, then follows
    the executor's plans.
    """

    def __init__(self, executor: Any, *, request_pool: Any = None, replayed: bool = False) -> None:
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
        if executor.engine is None:
            raise RuntimeError("attach the executor to an engine before enabling integrity mode "
                               "(the monitor tags what the engine's state already maps)")
        self._seed_from(executor.view)
        if getattr(executor, "swa_pool", None) is not None:  # the SWA layers of a hybrid
            self.swa = SwaMonitor(self, executor, executor.view, replayed=replayed)
        executor.listeners.append(self.on_plan)

    def _fresh_uid(self) -> int:
        uid = self.next_uid
        self.next_uid += 1
        return uid

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
        if self.swa is not None:
            self.swa.on_plan(event, plan)

    def end_batch(self) -> None:
        """The engine's batch is whole (the executor says so after moving its bytes)."""
        if self.swa is not None:
            self.swa.end_batch()

    def settle(self) -> None:
        """No decision is half done (a replayed log ended): pending SWA frees are final."""
        if self.swa is not None:
            self.swa.confirm()

    def _open(self, request_id: RequestId) -> None:
        self.open(request_id)
        self.uid_of[request_id] = self._fresh_uid()

    def _copy(self, src_slots: Sequence[int], dst_slots: Sequence[int]) -> None:
        for src, dst in zip(src_slots, dst_slots, strict=True):
            content = self.slot_content.get(src)
            if content is None:
                self.slot_content.pop(dst, None)
                self.copied.pop(dst, None)
            else:
                self.slot_content[dst] = self.copied[dst] = content
        self.overwritten(dst_slots)

    def _offload(self, device_slots: Sequence[int], host_slots: Sequence[int]) -> None:
        for device_slot, host_slot in zip(device_slots, host_slots, strict=True):
            content = self.linked_content(device_slot)
            if content is None:
                self.errors.append(f"offload of slot {device_slot}, which holds no computed KV")
                self.host_content.pop(host_slot, None)
            else:
                self.host_content[host_slot] = content
        self.dirty_host.update(host_slots)

    def _load(self, host_slots: Sequence[int], device_slots: Sequence[int]) -> None:
        for host_slot, device_slot in zip(host_slots, device_slots, strict=True):
            loaded = self.host_content.get(host_slot)
            if loaded is None:
                self.errors.append(f"load from host slot {host_slot}, which holds no backup")
                self.slot_content.pop(device_slot, None)
            else:
                self.slot_content[device_slot] = loaded
        self.overwritten(device_slots)

    def _link(self, linked: Sequence[tuple[RequestId, int, int]],
              nulled: Sequence[tuple[RequestId, int, int]]) -> None:
        if nulled:  # null entries (block mode) interleave with links by position
            null = set(nulled)
            tokens: Sequence[tuple[RequestId, int, int]] = sorted((*linked, *nulled),
                                                                  key=lambda token: token[1])
        else:
            null, tokens = set(), linked
        contents = []
        for request_id, position, slot in tokens:
            if null and (request_id, position, slot) in null:
                contents.append(null_content(position, self.size))
                continue
            content = self.linked_content(slot)
            if content is None:
                self.errors.append(f"request {request_id!r} position {position} links slot {slot}, "
                                   "which holds no computed KV")
                content = (0, position)
            elif content[1] != position:
                self.errors.append(f"request {request_id!r} position {position} links slot {slot}, "
                                   f"whose KV was computed for position {content[1]}")
            contents.append(content)
        self.map_tokens(tokens, contents)

    def _write_request_tokens(self, tokens: Sequence[tuple[RequestId, int, int]]) -> None:
        uid_of, copied = self.uid_of, self.copied
        if not copied:  # the usual case: every token is computed here
            contents = [(uid_of[request_id], position) for request_id, position, _ in tokens]
            slots = [slot for _, _, slot in tokens]
            self.slot_content.update(zip(slots, contents, strict=True))
            self.map_tokens(tokens, contents)
            self.write_tags(slots, contents)
            return
        slots, fresh, contents = [], [], []
        for request_id, position, slot in tokens:
            content = copied.pop(slot, None)
            if content is None or content[1] != position:
                content = (uid_of[request_id], position)
                slots.append(slot)
                fresh.append(content)
                self.slot_content[slot] = content
            # else: bytes a Copy put here (copy-on-write): nothing to compute
            contents.append(content)
        self.map_tokens(tokens, contents)
        self.write_tags(slots, fresh)

    def _insert(self, node_id: int, depth: int, slots: Sequence[int]) -> None:
        uid = 0
        content_list: list[Content] = []
        fresh_slots, fresh = [], []
        for index, slot in enumerate(slots):
            position = depth + index
            content = self.slot_content.get(slot)
            if content is None or content[1] != position:
                uid = uid or self._fresh_uid()
                content = (uid, position)
                fresh_slots.append(slot)
                fresh.append(content)
                self.slot_content[slot] = content
            content_list.append(content)
        self.add_node(node_id, slots, content_list)
        self.write_tags(fresh_slots, fresh)

    def _adopt(self, node_id: int, depth: int, slots: Sequence[int]) -> None:
        """The node's tokens now read the KV its owner wrote at ``slots`` (``SwaAdopt``).

        Slots nobody wrote (a bare allocation's) get fresh tags, as an insert's
        do; a slot computed for another position is reported.
        """
        contents: list[Content] = []
        uid = 0
        fresh_slots, fresh = [], []
        for index, slot in enumerate(slots):
            content = self.slot_content.get(slot)
            if content is None:
                uid = uid or self._fresh_uid()
                content = self.slot_content[slot] = (uid, depth + index)
                fresh_slots.append(slot)
                fresh.append(content)
            elif content[1] != depth + index:
                self.errors.append(f"tree node {node_id} adopts slot {slot} as position "
                                   f"{depth + index}, which holds KV computed for position "
                                   f"{content[1]}")
            contents.append(content)
        self.demote_node(node_id)  # its old pages were freed by the same event
        self.add_node(node_id, slots, contents)
        self.write_tags(fresh_slots, fresh)

    # -- tags (computed in integrity_tags) -------------------------------------------
    def write_tags(self, slots: Sequence[int], contents: Sequence[Content]) -> None:
        """Write the tags of ``contents`` at ``slots`` in every layer (the forward pass's writes;
        in a hybrid the SWA layers write the same tokens where the full -> SWA mapping says)."""
        if slots:
            if self.swa is None:
                self.layout.write(slots, contents)
            else:
                self.swa.write(slots, contents, self.layout)
            self.wrote(slots)

    # -- checking ------------------------------------------------------------------------
    def verify(self, state: Any = None) -> IntegrityReport:
        """Full check: every live token through every export, the tree, host copies (read-only)."""
        return verify_full(self, self.executor.view if state is None else state)

    def check(self, state: Any = None) -> IntegrityReport:
        """Incremental check: only what changed since the last check or verification."""
        return check_changes(self, self.executor.view if state is None else state)

    def check_read(self, request_id: RequestId, slots: Sequence[int], start: int = 0,
                   state: Any = None) -> IntegrityReport:
        """A kernel-style read: ``slots`` (taken from some table) for positions ``start..``.

        Reports a dangling position as a use after free, a slot that is not
        the one the state maps, and bytes that are not the expected tags.
        """
        return check_kernel_read(self, self.executor.view if state is None else state,
                                 request_id, slots, start)


def enable_integrity(executor: Any, *, request_pool: Any = None,
                     replayed: bool = False) -> IntegrityMonitor:
    """Attach a monitor to ``executor`` (tags what its state already maps); returns it.

    ``replayed``: the engine applies a log one event per batch, so a batch is
    not a whole front-end decision (this matters to the SWA window checks only:
    :mod:`kvstate.executor.integrity_swa`).
    """
    monitor = IntegrityMonitor(executor, request_pool=request_pool, replayed=replayed)
    executor.integrity = monitor
    return monitor
