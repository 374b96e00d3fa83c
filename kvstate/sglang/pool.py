"""``ReqToTokenPool``: request rows and their token -> slot table.

Rows are ``1..size``, handed out from the top and reused LIFO (SGLang
0.5.23); row 0 is the padding row.  ``req_to_token`` is a real int32
tensor ``[size + 1, max_context_len]`` that SGLang's kernels may read
directly; the pool owns it and ``kvstate.sglang.table.TableMirror`` keeps it
equal to the state.  The only way to change it is ``write`` (or any other
event on the engine): assigning into the tensor is a bypass that
``verify()`` reports.
"""

from __future__ import annotations

from typing import Any

import torch

from kvstate.engine import Engine
from kvstate.events import Assign, Event, ReqAlloc, ReqFree, Reset, Scatter
from kvstate.invariants import Violation
from kvstate.sglang.binding import FrontEndMixin, engine_for_pool
from kvstate.sglang.inputs import as_int, int_list
from kvstate.sglang.table import TableMirror, table_violations


class ReqToTokenPool(FrontEndMixin):
    def __init__(self, size: int, max_context_len: int, device: str = "cpu",
                 enable_memory_saver: bool = False, *, engine: Engine | None = None) -> None:
        for name, value in (("size", size), ("max_context_len", max_context_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.size = size
        self.max_context_len = max_context_len
        self.device = device
        self.engine = engine_for_pool(size, max_context_len, engine)
        self._table = torch.zeros((size + 1, max_context_len), dtype=torch.int32, device=device)
        self._mirror = TableMirror(self._table)
        self.engine.subscribe(self._mirror)

    @property
    def req_to_token(self) -> torch.Tensor:
        """The row table itself (not a copy); read it, change it only through ``write``."""
        return self._table

    def available_size(self) -> int:
        return len(self.engine.view.free_rows)

    # -- rows -------------------------------------------------------------------
    def alloc(self, need_size: int) -> list[int] | None:
        """``need_size`` rows (ascending), or ``None`` if fewer are free.  Commits ``ReqAlloc``."""
        count = as_int(need_size, "need_size")
        free_rows = self.engine.view.free_rows
        if count > len(free_rows):
            return None
        if count == 0:
            return []
        rows = free_rows.head(count)[::-1]
        self._commit(ReqAlloc(tuple(rows)))
        return rows

    def alloc_rows(self, need_size: int) -> list[int] | None:
        """0.5.23's name for ``alloc``.  Commits ``ReqAlloc``."""
        return self.alloc(need_size)

    def free(self, free_index: Any) -> None:
        """Close a row, rows, or a ``Req``'s row (then ``req.req_pool_idx`` becomes ``None``).

        Commits ``ReqFree``: the rows go back on top of the stack, the last
        one first to be reused; entries freed under a row are released with it.
        """
        if hasattr(free_index, "req_pool_idx"):
            row = free_index.req_pool_idx
            if row is None:
                raise ValueError(f"{free_index!r} holds no request row")
            rows = int_list([row], "rows to free", low=1, high=self.size)
            with self.engine.batch() as batch:
                batch.emit(ReqFree(tuple(rows)))
                # Inside the batch: a listener failing at the commit raises after the row
                # was freed, and the request must not keep it.
                free_index.req_pool_idx = None
            return
        if free_index is None:
            raise TypeError("free() takes a row, a list of rows or a Req, got None")
        self.free_rows(int_list(free_index, "rows to free", low=1, high=self.size))

    def free_rows(self, indices: Any) -> None:
        """0.5.23's row-list form of ``free``.  Commits ``ReqFree``."""
        rows = int_list(indices, "rows to free", low=1, high=self.size)
        if rows:
            self._commit(ReqFree(tuple(rows)))

    def clear(self) -> None:
        """Close every row.  Commits ``Reset("rows")`` (the tensor keeps its old values)."""
        self._commit(Reset("rows"))

    # -- the table -----------------------------------------------------------------
    def write(self, indices: Any, values: Any) -> None:
        """``req_to_token[indices] = values``, through the state.

        ``(row, slice)`` or ``(row, position)`` commits one ``Assign``;
        SGLang's batched form ``(row_indices, positions)`` (tensors or lists,
        one position per distinct row, as a decode step writes) commits one
        ``Scatter``.  A malformed index (a slice with a step, negative or
        out-of-range positions, a length that does not match ``values``) is
        refused before anything changes.
        """
        if not isinstance(indices, tuple) or len(indices) != 2:
            raise TypeError("write takes (row, slice), (row, position) or (row_indices, positions)")
        rows, where = indices
        tensors: tuple[Any, ...]
        if _is_vector(rows):
            event = self._scatter(rows, where, values)
            tensors = (rows, where, values)
        else:
            event = self._assign(as_int(rows, "row", low=1, high=self.size), where, values)
            tensors = (values,)
        if event is None:
            return
        if all(isinstance(t, torch.Tensor) for t in tensors):
            self._mirror.given(event, *(t.reshape(-1) for t in tensors))
        self._commit(event)

    def _assign(self, row: int, where: Any, values: Any) -> Event | None:
        slots = int_list(values, "values")
        width = self.max_context_len
        if isinstance(where, slice):
            if where.step not in (None, 1):
                raise ValueError(f"write slices must be contiguous; step {where.step!r} is not "
                                 "supported")
            start = 0 if where.start is None else as_int(where.start, "slice start", high=width)
            stop = (start + len(slots) if where.stop is None
                    else as_int(where.stop, "slice stop", high=width))
            if stop < start:
                raise ValueError(f"slice {start}:{stop} ends before it starts")
            if stop - start != len(slots):
                raise ValueError(f"slice {start}:{stop} covers {stop - start} positions but "
                                 f"{len(slots)} values were given")
        else:
            start = as_int(where, "position", high=width - 1)
            if len(slots) != 1:
                raise ValueError(f"one position takes one value, got {len(slots)}")
        if start + len(slots) > width:
            raise ValueError(f"write to position {start + len(slots) - 1} is past max_context_len "
                             f"{width}")
        return Assign(row, start, tuple(slots)) if slots else None

    def _scatter(self, rows: Any, positions: Any, values: Any) -> Event | None:
        if isinstance(positions, slice):
            raise TypeError("the batched form takes one position per row, not a slice")
        row_list = int_list(rows, "row indices", low=1, high=self.size)
        position_list = int_list(positions, "positions", high=self.max_context_len - 1)
        slots = int_list(values, "values")
        if not len(row_list) == len(position_list) == len(slots):
            raise ValueError(f"{len(row_list)} rows, {len(position_list)} positions and "
                             f"{len(slots)} values: the batched form needs one of each per write")
        if len(set(row_list)) != len(row_list):
            raise ValueError("the batched form writes each row at most once per call")
        if not slots:
            return None
        return Scatter(tuple(zip(row_list, position_list, slots, strict=True)))

    def verify(self) -> list[Violation]:
        """Compare ``req_to_token`` with the state; one ``Violation`` per row that differs.

        The same ``Violation`` type ``kvstate.check`` returns, so callers can
        report both together.  Positions past a row's end are not compared.
        """
        return table_violations(self._table, self.engine.view)

    def _commit(self, event: Event) -> None:
        # Every field was checked above (exact ints in range), so the event skips re-validation.
        self.engine.commit_events((event,))


def _is_vector(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dim() == 1
    return isinstance(value, (list, tuple)) or (hasattr(value, "__len__")
                                                and not isinstance(value, (str, bytes)))


__all__ = ["ReqToTokenPool"]
