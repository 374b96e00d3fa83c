"""What the integrity monitor does when bytes are written or move: its ``Writes`` base.

``Writes`` is the base of :class:`~kvstate.executor.integrity.IntegrityMonitor`
between it and :class:`~kvstate.executor.integrity_tables.Tables`: the
bookkeeping of one event's plan where KV is computed (a request's fresh
positions, a tree node's tokens nobody computed), linked (a request entry
that now reads KV already in the pool), copied, offloaded, loaded back or
adopted by a tree node; and ``write_tags``, the forward pass's write of the
tags into the executor's buffers (through the SWA monitor in a FULL + SWA
hybrid).  It owns nothing beyond what ``Tables`` and the monitor declare
below; every method mutates only the monitor's bookkeeping and, in
``write_tags``, the buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.executor.integrity_block import null_content
from kvstate.executor.integrity_tables import Tables
from kvstate.executor.integrity_tags import Content, TagLayout
from kvstate.state import RequestId


class Writes(Tables):
    """Fresh, linked, copied, host-moved and adopted KV in the monitor's tables."""

    layout: TagLayout
    swa: Any  # the SWA monitor of a FULL + SWA hybrid, or None
    next_uid: int
    copied: dict[int, Content]  # copy destinations not yet mapped by a request
    host_content: dict[int, Content]  # host slot -> what its bytes are

    def _fresh_uid(self) -> int:
        """A writer id nobody used: a request incarnation, or KV the tree received."""
        uid = self.next_uid
        self.next_uid += 1
        return uid

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


__all__ = ["Writes"]
