"""Integrity checks of the Mamba states: incremental (``check_mamba``) and full (``verify_mamba``).

Helpers of :class:`~kvstate.executor.integrity.IntegrityMonitor` for its
:class:`~kvstate.executor.integrity_mamba.MambaMonitor`.  Read-only on the
buffers and the state; they consume the Mamba monitor's dirty sets.

An incremental check looks at what changed since the last one:

* slots whose bytes the executor moved (a copy's destination, a freed slot
  it poisoned) are read back against what the monitor believes they hold;
* every changed slot's expectation (what its owner relies on) against its
  content (a write by someone who does not hold it shows here);
* the owners of slots that changed owner and the entries of changed rows
  against the state's (the plans against the rules), and, with an SGLang
  ``HybridReqToTokenPool`` attached, its mapping tensors' entries for those rows.

Elsewhere the bytes are known without reading: the monitor wrote them, or
read them back when they last moved.  A full verification reads every
state an owner relies on, every poisoned free slot, and each running row's
state through :func:`~kvstate.executor.exports_mamba.sglang_mamba_indices`
and through the pool's ``req_index_to_mamba_index_mapping`` (and the track
mapping): the slot a kernel would read must hold the row's state.  It also
compares every owner with the state's.
"""

from __future__ import annotations

from typing import Any

from kvstate.executor.exports_mamba import MambaStateLost, sglang_mamba_indices
from kvstate.executor.integrity_mamba import POISONED, MambaMonitor
from kvstate.executor.integrity_tags import Content
from kvstate.state import DETACHED, RequestId


def check_mamba(mm: MambaMonitor, state: Any, problems: list[str]) -> int:
    """The incremental check; returns the state reads made (x layers)."""
    if not mm.dirty:
        return 0
    checked = 0
    bad: set[int] = set()
    if mm.moved:
        moved = sorted(slot for slot in mm.moved if slot in mm.content)
        checked += _read_back(mm, moved, [mm.content[slot] for slot in moved], problems, bad)
    for slot in sorted(mm.changed - bad):
        want = mm.expect.get(slot)
        if want is not None and mm.content.get(slot) != want:
            problems.append(f"Mamba slot {slot} ({mm.owner(slot)}) should hold the state of "
                            f"position {want[1]}; another writer overwrote it")
    _owners(mm, state, sorted(mm.reowned), problems)
    _rows(mm, state, sorted(mm.rows_touched, key=str), problems)
    mm.clear_dirty()
    return checked


def verify_mamba(mm: MambaMonitor, state: Any, problems: list[str]) -> int:
    """The full verification; returns the state reads made (x layers)."""
    tier = state.mamba
    _owners(mm, state, sorted(set(mm.held) | set(mm.slot_node) | set(tier.held.keys())
                              | set(tier.slot_node.keys())), problems)
    _rows(mm, state, sorted(set(mm.rows) | set(tier.rows.keys()), key=str), problems)
    slots = sorted(slot for slot in mm.expect if slot in mm.held or slot in mm.slot_node)
    checked = _read_back(mm, slots, [mm.expect[slot] for slot in slots], problems, set())
    poisoned = sorted(slot for slot, content in mm.content.items() if content == POISONED)
    checked += _read_back(mm, poisoned, [POISONED] * len(poisoned), problems, set())
    checked += _kernel_reads(mm, state, problems)
    mm.clear_dirty()
    return checked


def _read_back(mm: MambaMonitor, slots: list[int], contents: list[Content], problems: list[str],
               bad: set[int]) -> int:
    """Compare the bytes of ``slots`` with ``contents``; a slot that differs is reported and
    forgotten (its content unknown)."""
    if not slots:
        return 0
    for row in mm.layout.mismatches(slots, contents):
        slot, want = slots[int(row)], contents[int(row)]
        if want == POISONED:
            problems.append(f"freed Mamba slot {slot} is not poisoned")
        else:
            problems.append(f"Mamba slot {slot} ({mm.owner(slot)}) does not hold the state of "
                            f"position {want[1]} it should (a copy or move went wrong, or "
                            "bytes changed under it)")
        mm.content.pop(slot, None)
        bad.add(slot)
    return len(slots) * mm.pool.layer_num


def _owners(mm: MambaMonitor, state: Any, slots: list[int], problems: list[str]) -> None:
    """Each slot's owner as the plans made it against the state's (the rules')."""
    tier = state.mamba
    for slot in slots:
        node, theirs = mm.slot_node.get(slot), tier.slot_node.get(slot)
        holder, held = mm.held.get(slot, None), tier.held.get(slot, None)
        if node != theirs or holder != held:
            problems.append(f"Mamba slot {slot} is {mm.owner(slot)} to the monitor, but "
                            f"{_state_owner(theirs, held)} in the state")


def _state_owner(node: int | None, holder: Any) -> str:
    if node is not None:
        return f"the state of tree node {node}"
    if holder is None:
        return "free"
    return "held DETACHED" if holder == DETACHED else f"held by row {holder!r}"


def _rows(mm: MambaMonitor, state: Any, rows: list[RequestId], problems: list[str]) -> None:
    """Each row's entries against the state's, and against an attached pool's mapping tensors."""
    tier = state.mamba
    running, track = _mappings(mm)
    for row in rows:
        mine, theirs = mm.rows.get(row), tier.rows.get(row)
        if (None if mine is None else tuple(mine)) != (None if theirs is None else tuple(theirs)):
            problems.append(f"row {row!r} holds Mamba slots {mine} to the monitor, {theirs} in "
                            "the state")
            continue
        if mine is None or type(row) is not int:
            continue
        if running is not None and mine[0] and int(running[row]) != mine[0]:
            problems.append(f"req_index_to_mamba_index_mapping[{row}] is {int(running[row])}; "
                            f"the row's running state is in slot {mine[0]}")
        if track is not None:
            for index, slot in enumerate(mine[1:]):
                if slot and int(track[row, index]) != slot:
                    problems.append(f"req_index_to_mamba_ping_pong_track_buffer_mapping[{row}, "
                                    f"{index}] is {int(track[row, index])}; the row's track "
                                    f"slot is {slot}")


def _mappings(mm: MambaMonitor) -> tuple[Any, Any]:
    pool = mm.monitor.request_pool
    return (getattr(pool, "req_index_to_mamba_index_mapping", None),
            getattr(pool, "req_index_to_mamba_ping_pong_track_buffer_mapping", None))


def _kernel_reads(mm: MambaMonitor, state: Any, problems: list[str]) -> int:
    """Each running row's state read the way a kernel finds it: through the export and
    through the pool's mapping tensors; the slot read must hold the row's state."""
    rows = [row for row, entries in mm.rows.items() if entries[0] and entries[0] in mm.expect]
    if not rows:
        return 0
    wanted = [mm.expect[mm.rows[row][0]] for row in rows]
    checked = 0
    try:
        via_state = sglang_mamba_indices(state, rows).tolist()
    except (MambaStateLost, KeyError) as exc:
        problems.append(f"sglang_mamba_indices: {exc}")
    else:
        checked += _reads(mm, "sglang_mamba_indices", rows, via_state, wanted, problems)
    running, track = _mappings(mm)
    ints = [row for row in rows if type(row) is int]
    if running is not None and ints:
        through = sglang_mamba_indices(state, ints, mapping=running).tolist()
        checked += _reads(mm, "req_index_to_mamba_index_mapping", ints, through,
                          [mm.expect[mm.rows[row][0]] for row in ints], problems)
    if track is not None:
        pairs = [(row, index, slot) for row, entries in mm.rows.items() if type(row) is int
                 for index, slot in enumerate(entries[1:]) if slot and slot in mm.expect]
        if pairs:
            slots = [int(track[row, index]) for row, index, _ in pairs]
            checked += _reads(mm, "req_index_to_mamba_ping_pong_track_buffer_mapping",
                              [row for row, _, _ in pairs], slots,
                              [mm.expect[slot] for _, _, slot in pairs], problems)
    return checked


def _reads(mm: MambaMonitor, via: str, rows: list[Any], slots: list[int],
           wanted: list[Content], problems: list[str]) -> int:
    inside = [i for i, slot in enumerate(slots) if 1 <= slot <= mm.pool.num_slots]
    for i in sorted(set(range(len(slots))) - set(inside)):
        problems.append(f"via {via}: request {rows[i]!r} reads Mamba slot {slots[i]}, outside "
                        f"1..{mm.pool.num_slots}")
    chosen = [slots[i] for i in inside]
    for row in mm.layout.mismatches(chosen, [wanted[i] for i in inside]):
        i = inside[int(row)]
        problems.append(f"via {via}: request {rows[i]!r} reads Mamba slot {slots[i]}, which "
                        f"does not hold its state (position {wanted[i][1]})")
    return len(chosen) * mm.pool.layer_num


__all__ = ["check_mamba", "verify_mamba"]
