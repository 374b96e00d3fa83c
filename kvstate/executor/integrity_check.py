"""Incremental integrity checks: read back only what changed since the last check.

A helper of :class:`~kvstate.executor.integrity.IntegrityMonitor` (``check``
and ``check_read``).  Read-only on the buffers and the state; it consumes
the monitor's dirty sets (``Tables.clear_dirty``) and nothing else.

What one check looks at:

* requests whose table changed (opened, closed, truncated, written,
  linked, dangled): the state and the monitor agree on which exist, how
  many tokens each maps, which page each table index maps and which entries
  dangle (the monitor built its tables from the index plans, the state from
  the rules);
* every reader of a page whose bytes the executor moved (a copy, a load, a
  free and its poisoning), of a page the monitor wrote tags to that anyone
  but its writer reads (a second request, a tree token, a cached copy), and
  of a new cached copy: the request entries and the tree token that map it
  (``Tables.readers``, ``tree_page``), the cached copy, or, with no reader,
  the slot's own content (a copy destination) or the poison (a freed slot).
  A freed slot a live entry still maps is a use after free;
* every host slot written since (an offload).

Each read ``(slot, expected content)`` is then settled.  Bytes are read back
(every layer, K and V, as exact integer words) where the executor moved them
since the last check, or where the expectation disagrees with what the
monitor knows the slot holds (``slot_content``).  Elsewhere the bytes are
known without reading: the monitor wrote them itself or they were read back
when they last moved, so comparing contents is exact (see
:mod:`kvstate.executor.integrity_tables` for why nothing else can change
between two checks).  So the work is proportional to the events since the
last check, not to the state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from kvstate.executor.integrity_host import check_host_slots
from kvstate.executor.integrity_swa_check import check_swa
from kvstate.executor.integrity_tags import NULL_UID, POISON_UID, Content
from kvstate.state import RequestId

POISONED: Content = (POISON_UID, 0)
Reads = dict[tuple[Any, ...], tuple[int, Content]]  # label -> (slot, expected content)


@attrs.frozen
class IntegrityReport:
    """What a check found: ``ok``, the ``problems`` and how many token reads (x layers) it made."""

    ok: bool
    problems: tuple[str, ...]
    tokens_checked: int

    def __str__(self) -> str:
        if self.ok:
            return f"integrity ok: {self.tokens_checked} token reads matched their tags"
        shown = "; ".join(self.problems[:5])
        more = f" (+{len(self.problems) - 5} more)" if len(self.problems) > 5 else ""
        return f"integrity FAILED: {shown}{more}"


CLEAN = IntegrityReport(True, (), 0)  # a check with nothing to check


def check_changes(monitor: Any, state: Any) -> IntegrityReport:
    swa = monitor.swa
    if not monitor.dirty and monitor.reported == len(monitor.errors) and (
            swa is None or not swa.dirty):
        return CLEAN
    problems = monitor.errors[monitor.reported:]
    monitor.reported = len(monitor.errors)
    reads: Reads = {}
    _request_tables(monitor, state, problems)
    poisoned = _page_reads(monitor, _pages_to_check(monitor), reads, problems)
    checked = check_host_slots(monitor, sorted(monitor.dirty_host), problems) if \
        monitor.dirty_host else 0
    checked += compare(monitor, reads, problems)
    if poisoned:
        bad = monitor.layout.unpoisoned_pages(poisoned)
        if bad:
            problems.append(f"freed page {bad[0]} is not poisoned ({len(bad)} pages)")
        checked += len(poisoned) * monitor.size * monitor.executor.layer_num
    if swa is not None and swa.dirty:
        checked += check_swa(swa, state, problems)
    monitor.clear_dirty()
    if not problems and not checked:
        return CLEAN
    return IntegrityReport(not problems, tuple(problems), checked)


def _request_tables(monitor: Any, state: Any, problems: list[str]) -> None:
    """Touched requests: the state and the monitor agree on existence, length, table, dangling.

    The monitor builds its tables from the index plans, the state from the
    rules, so this checks the planner against the rules; with the tables
    equal, a position reads the slot the monitor wrote or linked there.
    """
    requests, size = state.requests, monitor.size
    for request_id in monitor.touched:
        record = requests.get(request_id)
        tables = monitor.tables_of(request_id)
        if (record is None) != (tables is None):
            where = "open in the state" if tables is None else "closed in the state"
            problems.append(f"request {request_id!r} is {where} but not in the monitor's tables")
            continue
        if record is None or tables is None:
            continue
        tokens, pages, dangling = tables
        if record.allocated != len(tokens):
            problems.append(f"request {request_id!r} maps {record.allocated} tokens, monitor knows "
                            f"{len(tokens)}")
            continue
        mapped = record.pages
        if (mapped != pages if isinstance(mapped, list) else mapped != tuple(pages)):
            index = next((i for i, (a, b) in enumerate(zip(mapped, pages, strict=False))
                          if a != b), min(len(mapped), len(pages)))
            problems.append(f"request {request_id!r} table index {index} (positions from "
                            f"{index * size}): the state maps page "
                            f"{mapped[index] if index < len(mapped) else None}, the executor's "
                            f"plans say {pages[index] if index < len(pages) else None}")
        elif len(record.dangling) != len(dangling) or any(i not in dangling
                                                          for i in record.dangling):
            problems.append(f"request {request_id!r}: dangling entries {sorted(record.dangling)} "
                            f"in the state, {sorted(dangling)} in the executor's plans")


def _pages_to_check(monitor: Any) -> set[int]:
    """Pages whose bytes the executor moved, new cached copies, and written pages someone
    other than their writer may read (a second reader, a tree token, a cached copy)."""
    size = monitor.size
    pages = {slot // size for slot in monitor.moved} if size > 1 else set(monitor.moved)
    pages |= monitor.check_pages
    readers, tree_page, cached = monitor.readers, monitor.tree_page, monitor.cached
    for page in monitor.fresh_pages:
        mapped = readers.get(page)
        if (mapped is not None and len(mapped) > 1) or page in tree_page or page in cached:
            pages.add(page)
    return pages


def _page_reads(monitor: Any, pages: set[int], reads: Reads, problems: list[str]) -> list[int]:
    """Every reader of every slot of ``pages``; a freed slot must have none.

    Returns the pages that are wholly freed, read by no one and poisoned (the
    usual aftermath of a free): their bytes are checked page-wise.
    """
    size, slot_content, moved = monitor.size, monitor.slot_content, monitor.moved
    freed = {slot for slot in monitor.freed if slot not in slot_content}
    poison = monitor.executor.poison_freed
    poisoned: list[int] = []
    for page in pages:
        slots = range(page * size, page * size + size)
        readers = monitor.readers.get(page)
        entry = monitor.tree_page.get(page)
        cached = monitor.cached.get(page) if monitor.block else None
        gone = [slot for slot in slots if slot in freed] if freed else []
        for request_id, index in (readers or {}).items():
            tokens = monitor.req_content[request_id]
            mapped = [slot for slot in gone if index * size + slot % size < len(tokens)]
            if mapped:  # a live entry maps a freed slot: reported once per entry, not read
                problems.append(f"use after free: request {request_id!r} position "
                                f"{index * size + mapped[0] % size} maps slot {mapped[0]}, which "
                                "was freed")
            for slot in slots:
                position = index * size + slot % size
                if slot in freed:
                    reads.pop(("r", request_id, position), None)
                elif position < len(tokens):
                    reads.setdefault(("r", request_id, position), (slot, tokens[position]))
        if entry is not None:
            node_id, index = entry
            tokens = monitor.node_content[node_id]
            if gone:
                problems.append(f"use after free: tree node {node_id} maps slot {gone[0]}, which "
                                "was freed")
            for slot in slots:
                if slot not in freed:
                    token = index * size + slot % size
                    reads[("n", node_id, token)] = (slot, tokens[token])
        if cached is not None:
            _cached_reads(monitor, page, cached, slots, reads, problems)
        if readers or entry is not None or cached is not None:
            continue
        if poison and len(gone) == size and all(slot in moved for slot in slots):
            poisoned.append(page)
            continue
        for slot in slots:
            if slot in freed:
                if poison and slot in moved:
                    reads[("s", slot)] = (slot, POISONED)
            elif slot in moved and slot in slot_content:  # a copy destination nobody maps yet
                reads[("s", slot)] = (slot, slot_content[slot])
    return poisoned


def _cached_reads(monitor: Any, page: int, cached: tuple[int, int], slots: Sequence[int],
                  reads: Reads, problems: list[str]) -> None:
    node_id, depth = cached
    for slot in slots:
        position = depth + slot % monitor.size
        content = monitor.slot_content.get(slot)
        if content is None or content[1] != position:
            problems.append(f"cached page {page} (tree node {node_id}) holds no KV computed for "
                            f"position {position}")
        else:
            reads[("c", node_id, slot)] = (slot, content)


def compare(monitor: Any, reads: Reads, problems: list[str]) -> int:
    """Settle every ``(slot, content)`` of ``reads``; rows x layers checked.

    A slot the executor did not move since the last check holds what the
    monitor knows (``slot_content``: its own tags, or bytes read back when
    they last moved): a read that expects exactly that is settled without
    touching the buffers.  The rest are read back, all layers at once.
    """
    if not reads:
        return 0
    slot_content, moved, size = monitor.slot_content, monitor.moved, monitor.size
    labels = []
    for label, (slot, content) in reads.items():
        if slot not in moved and (slot_content.get(slot) == content
                                  or (content[0] == NULL_UID and slot == content[1] < size)):
            continue
        labels.append(label)
    if labels:
        slots = [reads[label][0] for label in labels]
        contents = [reads[label][1] for label in labels]
        bad = monitor.layout.mismatches(slots, contents)
        for row in bad[:8]:
            layer = monitor.layout.first_bad_layer(slots[row], contents[row])
            problems.append(describe(labels[row], slots[row], layer))
        if len(bad) > 8:
            problems.append(f"... {len(bad) - 8} more bad reads")
    return len(reads) * monitor.executor.layer_num


def describe(label: tuple[Any, ...], slot: int, layer: int) -> str:
    kind = label[0]
    if kind == "r":
        return (f"layer {layer}: request {label[1]!r} position {label[2]} reads another token's "
                f"tag (slot {slot})")
    if kind == "n":
        return f"layer {layer}: a tree token does not read back its tag (node {label[1]} token " \
               f"{label[2]}, slot {slot})"
    if kind == "c":
        return f"layer {layer}: cached block of tree node {label[1]} at slot {slot} does not " \
               "read back its tag"
    return f"layer {layer}: slot {slot} does not hold what was copied, loaded or poisoned there"


def check_kernel_read(monitor: Any, state: Any, request_id: RequestId, slots: Any,
                      start: int) -> IntegrityReport:
    """See :meth:`~kvstate.executor.integrity.IntegrityMonitor.check_read`."""
    listed = slots.tolist() if hasattr(slots, "tolist") else list(slots)
    record = state.requests.get(request_id)
    tables = monitor.tables_of(request_id)
    if record is None or tables is None:
        return IntegrityReport(False, (f"read of unknown request {request_id!r}",), 0)
    size = monitor.size
    problems: list[str] = []
    reads: Reads = {}
    for position, slot in enumerate(listed, start=start):
        index = position // size
        if position >= record.allocated:
            problems.append(f"request {request_id!r} position {position} is past its "
                            f"{record.allocated} mapped tokens")
        elif index in record.dangling or index in tables[2]:  # the state's or the plans' word
            problems.append(f"use after free: request {request_id!r} position {position} reads "
                            f"slot {slot}, whose page {tables[1][index]} was freed under the "
                            "row (FreeMapped)")
        elif slot != record.pages[index] * size + position % size:
            problems.append(f"request {request_id!r} position {position} reads slot {slot}; "
                            f"its table maps slot {record.pages[index] * size + position % size}")
        else:
            reads[("r", request_id, position)] = (slot, tables[0][position])
    checked = compare(monitor, reads, problems)
    return IntegrityReport(not problems, tuple(problems), checked)
