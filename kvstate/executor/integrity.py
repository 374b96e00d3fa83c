"""Integrity mode: the executor proves the metadata by reading back tags.

While enabled, every token a forward pass would compute gets a deterministic
tag written into its slot in every layer: a pattern of small integers (exact
in fp16/bf16/fp32; computed in :mod:`kvstate.executor.integrity_tags`) derived
from ``(writer, position, layer)``, where the writer is a request incarnation
(a request id plus a counter, since rows are reused) or, for KV the tree
received without a writing request, the inserting node.  The monitor keeps,
independently of the buffers, which tag every live token *should* hold:

    request r, position p   -> the tag its own write left there, or the tag of
                               the tree / shared token it was linked to
    tree node n, token i    -> the tag of the token inserted there

``verify(state)`` then reads every live token of every request (and every
tree token) back through every export (``gather_kv``, the FlashInfer page
table, vLLM's block table and slot mapping, SGLang's ``req_to_token``) and
compares.  Two live tokens sharing a slot, a stale prefix hit (a tree page
reused while its node survives), a missed copy-on-write or a wrong copy all
show up as a token reading someone else's tag.  Linking a position to a
token computed for a different position is reported at the event.

Block-mode (vLLM) states are followed too (:mod:`kvstate.executor.integrity_block`):
a cached block is checked against its node's depth, and a null-page table
entry must read the padding page.

The monitor mutates its own bookkeeping and writes tags into the executor's
buffers (through ``set_kv_buffer``); it never changes a ``State``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import torch

from kvstate.events import Event
from kvstate.executor.integrity_block import block_tree_reads, cache_blocks, null_content, seed_block_cache
from kvstate.executor.integrity_host import verify_host
from kvstate.executor.integrity_tags import Content, TagRows, expected_tags, write_tags
from kvstate.executor.integrity_tags import tag_values as tag_values  # re-exported (moved)
from kvstate.executor.plan import IndexPlan, node_depth
from kvstate.executor.readback import compare_reads, export_reads
from kvstate.state import RequestId, State


@attrs.frozen
class IntegrityReport:
    ok: bool
    problems: tuple[str, ...]
    tokens_checked: int

    def __str__(self) -> str:
        if self.ok:
            return f"integrity ok: {self.tokens_checked} token reads matched their tags"
        shown = "; ".join(self.problems[:5])
        more = f" (+{len(self.problems) - 5} more)" if len(self.problems) > 5 else ""
        return f"integrity FAILED: {shown}{more}"


class IntegrityMonitor:
    """Tag writer and checker for one executor (owns only its bookkeeping)."""

    def __init__(self, executor: Any, *, request_pool: Any = None) -> None:
        self.executor = executor
        self.request_pool = request_pool  # optional SGLang ReqToTokenPool to read as well
        self.next_uid = 1
        self.uid_of: dict[RequestId, int] = {}
        self.req_content: dict[RequestId, list[Content]] = {}
        self.node_content: dict[int, list[Content]] = {}
        self.slot_content: dict[int, Content] = {}
        self.copied: dict[int, Content] = {}  # copy destinations not yet mapped by a request
        self.host_content: dict[int, Content] = {}  # host slot -> what its bytes are
        self.errors: list[str] = []
        self._seed_from(executor.state)
        executor.listeners.append(self.on_plan)

    def _fresh_uid(self) -> int:
        uid = self.next_uid
        self.next_uid += 1
        return uid

    def _seed_from(self, state: State) -> None:
        """Tag what a non-empty starting state already maps (as if freshly written).

        The tree first (block mode: the cached pages, which keep no node
        record, so a request slot's content is its ``slot_content``), then
        every request table; a block-mode null entry (page 0) reads the padding.
        """
        block = state.geometry.mode == "block"
        if block:
            seed_block_cache(self, state)
        else:
            for node_id in sorted(n for n in state.nodes.keys() if n != 0):
                self._insert(node_id, node_depth(state, node_id), state.node_slots(node_id))
        size = state.geometry.page_size
        for request_id in state.requests.keys():
            self.uid_of[request_id] = self._fresh_uid()
            self.req_content[request_id] = []
            fresh = []
            for position, slot in enumerate(state.slots_of(request_id)):
                if block and slot < size:
                    self._set(request_id, position, null_content(position, size))
                    continue
                content = self._linked_content(state, slot)
                if content is not None and content[1] == position:
                    self._set(request_id, position, content)
                else:
                    fresh.append((request_id, position, slot))
            self._write_request_tokens(state, fresh)

    # -- following events --------------------------------------------------------
    def on_plan(self, event: Event, before: State, after: State, plan: IndexPlan) -> None:
        for request_id in plan.opened:
            self.uid_of[request_id] = self._fresh_uid()
            self.req_content[request_id] = []
        for src, dst in zip(plan.copy_src, plan.copy_dst, strict=True):
            content = self.slot_content.get(src)
            if content is None:
                self.slot_content.pop(dst, None)
                self.copied.pop(dst, None)
            else:
                self.slot_content[dst] = self.copied[dst] = content
        for device_slot, host_slot in zip(plan.host_out_src, plan.host_out_dst, strict=True):
            content = self._linked_content(after, device_slot)
            if content is None:
                self.errors.append(f"offload of slot {device_slot}, which holds no computed KV")
                self.host_content.pop(host_slot, None)
            else:
                self.host_content[host_slot] = content
        for slot in plan.freed_slots:
            self.slot_content.pop(slot, None)
            self.copied.pop(slot, None)
        for host_slot in plan.host_freed:
            self.host_content.pop(host_slot, None)
        for host_slot, device_slot in zip(plan.host_in_src, plan.host_in_dst, strict=True):
            loaded = self.host_content.get(host_slot)
            if loaded is None:
                self.errors.append(f"load from host slot {host_slot}, which holds no backup")
                self.slot_content.pop(device_slot, None)
            else:
                self.slot_content[device_slot] = loaded
        for node_id in plan.loaded_nodes:
            if node_id not in self.node_content:
                self.errors.append(f"loaded node {node_id} has no tag record")
        for request_id, length in plan.truncated:
            del self.req_content[request_id][length:]
        if plan.new_tokens:
            self._write_request_tokens(after, plan.new_tokens)
        size = after.geometry.page_size
        linked = plan.linked_tokens
        nulled = set(plan.nulled_tokens)
        if nulled:  # null entries (block mode) interleave with links by position
            linked = tuple(sorted((*linked, *nulled), key=lambda token: token[1]))
        for request_id, position, slot in linked:
            if nulled and (request_id, position, slot) in nulled:
                self._set(request_id, position, null_content(position, size))
                continue
            content = self._linked_content(after, slot)
            if content is None:
                self.errors.append(f"request {request_id!r} position {position} links slot {slot}, "
                                   "which holds no computed KV")
                content = (0, position)
            elif content[1] != position:
                self.errors.append(f"request {request_id!r} position {position} links slot {slot}, "
                                   f"whose KV was computed for position {content[1]}")
            self._set(request_id, position, content)
        if plan.cached_blocks:
            cache_blocks(self, plan.cached_blocks)
        for node_id, depth, slots in plan.inserted:
            self._insert(node_id, depth, slots)
        for node_id, at, new_node in plan.split:
            tokens = self.node_content.pop(node_id)
            self.node_content[new_node] = tokens[:at]
            self.node_content[node_id] = tokens[at:]
        for node_id in plan.dropped_nodes:
            self.node_content.pop(node_id, None)
        if plan.reset_nodes:
            self.node_content.clear()
        for request_id in plan.closed:
            self.req_content.pop(request_id, None)
            self.uid_of.pop(request_id, None)

    def _linked_content(self, state: State, slot: int) -> Content | None:
        size = state.geometry.page_size
        page = slot // size
        node_id = state.page_node.get(page)
        if node_id is not None and node_id in self.node_content:
            index = state.nodes[node_id].pages.index(page) * size + slot % size
            return self.node_content[node_id][index]
        return self.slot_content.get(slot)

    def _set(self, request_id: RequestId, position: int, content: Content) -> None:
        row = self.req_content[request_id]
        if position == len(row):
            row.append(content)
        elif position < len(row):
            row[position] = content
        else:
            self.errors.append(f"request {request_id!r} got position {position} past its "
                               f"{len(row)} known tokens")
            row.extend([(0, -1)] * (position - len(row)))
            row.append(content)

    def _write_request_tokens(self, state: State, tokens: Sequence[tuple[RequestId, int, int]]) -> None:
        slots, contents = [], []
        for request_id, position, slot in tokens:
            copied = self.copied.pop(slot, None)
            if copied is not None and copied[1] == position:
                content = copied  # bytes a Copy put here (copy-on-write): nothing to compute
            else:
                content = (self.uid_of[request_id], position)
                slots.append(slot)
                contents.append(content)
                self.slot_content[slot] = content
            self._set(request_id, position, content)
        self.write_tags(slots, contents)

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
        self.node_content[node_id] = content_list
        self.write_tags(fresh_slots, fresh)

    # -- tags (computed in integrity_tags) -------------------------------------------
    def expected(self, contents: Sequence[Content] | TagRows,
                 layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Expected ``(k, v)`` rows for ``contents`` in one layer, in the buffers' dtype."""
        return expected_tags(self.executor, contents, layer)

    def write_tags(self, slots: Sequence[int], contents: Sequence[Content]) -> None:
        """Write the tags of ``contents`` at ``slots`` in every layer (the forward pass's writes)."""
        write_tags(self.executor, slots, contents)

    # -- checking --------------------------------------------------------------------
    def verify(self, state: State | None = None) -> IntegrityReport:
        """Read every live token back through every export and compare with its tag (read-only)."""
        state = self.executor.state if state is None else state
        problems = list(self.errors)
        requests = list(state.requests.keys())
        known = set(self.req_content)
        if known != set(requests):
            problems.append(f"requests tracked {sorted(map(str, known))} differ from the state's "
                            f"{sorted(map(str, requests))}")
            requests = [r for r in requests if r in known]
        lengths = []
        for request_id in requests:
            length = state.requests[request_id].allocated
            if len(self.req_content[request_id]) != length:
                problems.append(f"request {request_id!r} maps {length} tokens, monitor knows "
                                f"{len(self.req_content[request_id])}")
            lengths.append(min(length, len(self.req_content[request_id])))
        contents = [c for r, n in zip(requests, lengths, strict=True) for c in self.req_content[r][:n]]
        reads = export_reads(self.executor, state, requests, lengths, self.request_pool)
        node_ids = [] if state.geometry.mode == "block" else [n for n in state.nodes.keys() if n != 0]
        node_slots: list[int] = []
        node_contents: list[Content] = []
        if state.geometry.mode == "block":
            node_slots, node_contents = block_tree_reads(self, state, problems)
        for node_id in node_ids:
            slots = state.node_slots(node_id)
            content = self.node_content.get(node_id)
            if content is None or len(content) != len(slots):
                problems.append(f"tree node {node_id} has no matching tag record")
                continue
            node_slots.extend(slots)
            node_contents.extend(content)
        checked = 0
        device = self.executor.device
        request_rows = TagRows(contents, device) if contents else None
        tree_rows = TagRows(node_contents, device) if node_contents else None
        index = torch.tensor(node_slots, dtype=torch.int64, device=device) if node_contents else None
        for layer in range(self.executor.layer_num):
            if request_rows is not None:
                k_want, v_want = self.expected(request_rows, layer)
                for name, (k_got, v_got) in reads(layer).items():
                    checked += len(contents)
                    problems.extend(compare_reads(name, layer, k_got, k_want, v_got, v_want,
                                             requests, lengths))
            if tree_rows is not None and index is not None:
                k_want, v_want = self.expected(tree_rows, layer)
                k_buf, v_buf = self.executor.get_kv_buffer(layer)
                checked += len(node_contents)
                if not (torch.equal(k_buf.index_select(0, index), k_want)
                        and torch.equal(v_buf.index_select(0, index), v_want)):
                    problems.append(f"layer {layer}: a tree token does not read back its tag")
        checked += verify_host(self, state, problems)
        return IntegrityReport(not problems, tuple(problems), checked)


def enable_integrity(executor: Any, *, request_pool: Any = None) -> IntegrityMonitor:
    """Attach a monitor to ``executor`` (tags what its state already maps); returns it."""
    monitor = IntegrityMonitor(executor, request_pool=request_pool)
    executor.integrity = monitor
    return monitor
