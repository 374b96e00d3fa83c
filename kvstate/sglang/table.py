"""``req_to_token`` as a real tensor, kept equal to the request tables by an engine listener.

SGLang's attention backends hand ``ReqToTokenPool.req_to_token`` (int32,
``[size + 1, max_context_len]``) straight to Triton / FlashInfer kernels, so
it must be a plain ``torch.Tensor``.  The state is the source of truth: the
pool owns the tensor, and ``TableMirror`` (subscribed to the engine) writes
into it every table change a committed batch made, wherever the events came
from (the pool's ``write``, a checkpoint, the planner's extend and decode).

Only positions ``[0, allocated)`` of open rows are kept equal.  Like
SGLang, the rest keeps whatever was written last (freed rows, positions past
a row's end, entries freed under a live row), and nothing zeroes it.
``table_violations`` compares the tensor with the state, so a write that
bypassed the events (someone assigning into the tensor) is reported rather
than believed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvstate.events import Allocate, Assign, Event, Scatter, Share
from kvstate.invariants import Violation
from kvstate.records import RequestId
from kvstate.sglang.inputs import cpu_array, int64_tensor
from kvstate.state import slot_span

CHECK_NAME = "req_to_token"

Write = tuple[int, int, Sequence[int]]  # (row, first position, slots)
_WRITING = frozenset({Allocate, Assign, Scatter, Share})  # the events that write table entries


class TableMirror:
    """Engine listener: applies each committed batch's table writes to ``table``.

    ``Assign``, ``Scatter`` and ``Share`` name their positions.  An
    ``Allocate`` appends at the row's length *before* the event, so
    ``before`` records its positions and ``after`` writes them once the
    batch is committed (a refused or rolled-back event writes nothing).
    A CPU table is written through a numpy view of its memory (an element
    write there costs a small fraction of a tensor element write).
    """

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table
        self._array = cpu_array(table)  # the same memory, for cheap writes on the CPU
        self._prepared: list[tuple[Event, list[Write]]] = []
        self._given: tuple[Event, tuple[torch.Tensor, ...]] | None = None

    def given(self, event: Event, *tensors: torch.Tensor) -> None:
        """The pool's caller passed ``event``'s values (and indices) as tensors: write those,
        rather than rebuilding tensors from the event's ints (same values, checked by the pool)."""
        self._given = (event, tensors)

    before_events = (Allocate,)  # the engine calls ``before`` for these alone

    def before(self, event: Allocate, view: Any) -> None:
        if event.items:
            self._prepared.append((event, _allocate_writes(event, view)))

    def discard(self, event: Event) -> None:
        self._prepared = [entry for entry in self._prepared if entry[0] is not event]

    def after(self, events: Sequence[Event], view: Any) -> None:
        # Entries whose batch was rolled back never match an event here; they go too.
        prepared, self._prepared = self._prepared, []
        given, self._given = self._given, None
        for event in events:
            if type(event) not in _WRITING:  # most events of a batch write no table entry
                continue
            if given is not None and given[0] is event:
                self._write_given(event, given[1])
            elif isinstance(event, Scatter):
                self._scatter(event.items)
            elif isinstance(event, (Assign, Share)):
                if type(event.request) is int and event.slots:
                    self._write(event.request, event.start, event.slots)
            elif isinstance(event, Allocate) and event.items:
                for prepared_event, writes in prepared:
                    if prepared_event is event:
                        for row, start, slots in writes:
                            self._write(row, start, slots)
                        break

    def _write(self, row: int, start: int, slots: Sequence[int]) -> None:
        array = self._array
        if array is not None:  # a CPU table: through its numpy view
            if len(slots) == 1:  # a decode step's slot
                array[row, start] = slots[0]
            else:
                array[row, start: start + len(slots)] = slots
            return
        values = int64_tensor(slots).to(device=self.table.device, dtype=torch.int32)
        self.table[row, start: start + len(slots)] = values

    def _write_given(self, event: Event, tensors: tuple[torch.Tensor, ...]) -> None:
        arrays = [cpu_array(t) for t in tensors] if self._array is not None else [None]
        if all(a is not None for a in arrays):  # CPU table and tensors: numpy, no conversions
            if isinstance(event, Scatter):
                self._array[arrays[0], arrays[1]] = arrays[2]
            elif isinstance(event, Assign):
                self._array[int(event.request), event.start: event.start + len(event.slots)] = \
                    arrays[0]
            return
        # Anything else (a device table, a tensor with no numpy view: a lazy negation, a
        # small or unsigned index dtype that torch would refuse or read as a mask) is written
        # from the event's ints, which are what the pool checked and the engine committed.
        if isinstance(event, Scatter):
            self._scatter(event.items)
        elif isinstance(event, Assign) and type(event.request) is int and event.slots:
            self._write(event.request, event.start, event.slots)

    def _scatter(self, items: Sequence[tuple[RequestId, int, int]]) -> None:
        rows = [row for row, _, _ in items if type(row) is int]
        if len(rows) != len(items):
            items = [item for item in items if type(item[0]) is int]
        if self._array is not None:
            self._array[rows, [position for _, position, _ in items]] = [s for _, _, s in items]
            return
        device = self.table.device
        positions = torch.tensor([position for _, position, _ in items], device=device)
        slots = torch.tensor([slot for _, _, slot in items], dtype=torch.int32, device=device)
        self.table[torch.tensor(rows, device=device), positions] = slots


def _allocate_writes(event: Allocate, view: Any) -> list[Write]:
    lengths: dict[int, int] = {}
    writes: list[Write] = []
    requests = view.requests
    for request_id, slots in event.items:
        if type(request_id) is not int or not slots or request_id not in requests:
            continue  # named requests have no row; an unknown one makes the rule refuse
        start = lengths.get(request_id, requests[request_id].allocated)
        writes.append((request_id, start, slots))
        lengths[request_id] = start + len(slots)
    return writes


def table_violations(table: torch.Tensor, view: Any) -> list[Violation]:
    """One ``Violation`` per open row whose mapped positions differ from ``table``."""
    problems: list[Violation] = []
    size = view.geometry.page_size
    for row, record in view.requests.items():
        if type(row) is not int or not record.allocated:
            continue
        expected = list(slot_span(record.pages, size, 0, record.allocated))
        if row >= table.shape[0] or record.allocated > table.shape[1]:
            problems.append(Violation(CHECK_NAME, f"row {row} maps {record.allocated} positions, "
                                                  f"outside the {tuple(table.shape)} table"))
            continue
        got = table[row, : record.allocated].tolist()
        if got != expected:
            wrong = [i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b]
            first = wrong[0]
            problems.append(Violation(
                CHECK_NAME, f"row {row} position {first}: req_to_token holds {got[first]}, the state "
                            f"maps slot {expected[first]} ({len(wrong)} of {record.allocated} "
                            "positions differ; a write bypassed ReqToTokenPool.write)"))
    return problems


__all__ = ["CHECK_NAME", "TableMirror", "table_violations"]
