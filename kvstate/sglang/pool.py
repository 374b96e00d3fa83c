"""``ReqToTokenPool``: request rows and their token -> slot table.

Rows are ``1..size``, handed out from the top and reused LIFO (SGLang
0.5.23); row 0 is the padding row.  ``req_to_token`` is a read-only int32
``[size + 1, max_context_len]`` view kept in step with the core's request
tables by listening to the engine; the only way to change it is ``write``.
"""

from __future__ import annotations

from typing import Any

import torch

from kvstate.engine import Engine
from kvstate.events import Allocate, Assign, Event, ReqAlloc, ReqFree, Reset
from kvstate.sglang.binding import FrontEndMixin, engine_for_pool
from kvstate.state import State


class ReadOnlyTable:
    """Indexing returns copies; assignment is refused (use ``ReqToTokenPool.write``)."""

    def __init__(self, table: torch.Tensor) -> None:
        self._table = table

    def __getitem__(self, index: Any) -> torch.Tensor:
        return self._table[index].clone()

    def __setitem__(self, index: Any, value: Any) -> None:
        raise TypeError("req_to_token is read-only; use ReqToTokenPool.write(indices, values)")

    @property
    def shape(self) -> torch.Size:
        return self._table.shape

    @property
    def dtype(self) -> torch.dtype:
        return self._table.dtype

    @property
    def device(self) -> torch.device:
        return self._table.device

    def to_tensor(self) -> torch.Tensor:
        return self._table.clone()


class ReqToTokenPool(FrontEndMixin):
    def __init__(self, size: int, max_context_len: int, device: str = "cpu",
                 *, engine: Engine | None = None) -> None:
        for name, value in (("size", size), ("max_context_len", max_context_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.size = size
        self.max_context_len = max_context_len
        self.device = device
        self.engine = engine_for_pool(size, max_context_len, engine)
        self._table = torch.zeros((size + 1, max_context_len), dtype=torch.int32, device=device)
        self.engine.subscribe(self._mirror)

    @property
    def req_to_token(self) -> ReadOnlyTable:
        return ReadOnlyTable(self._table)

    def available_size(self) -> int:
        return len(self.engine.state.free_rows)

    def alloc(self, need_size: int) -> list[int] | None:
        """``need_size`` rows, or ``None`` if fewer are free (nothing changes then)."""
        if need_size > self.available_size():
            return None
        if need_size <= 0:
            return []
        rows = list(reversed(self.engine.state.free_rows.head(need_size)))
        self.engine.apply(ReqAlloc(tuple(rows)))
        return rows

    def free(self, free_index: int | list[int]) -> None:
        rows = [free_index] if isinstance(free_index, int) else [int(r) for r in free_index]
        self.engine.apply(ReqFree(tuple(rows)))

    def clear(self) -> None:
        self.engine.apply(Reset("rows"))

    def write(self, indices: Any, values: Any) -> None:
        """``req_to_token[indices] = values`` for ``(row, slice)`` or ``(row, position)``."""
        row, where = indices
        row = int(row)
        slots = [int(v) for v in torch.as_tensor(values).reshape(-1).tolist()]
        if isinstance(where, slice):
            start = 0 if where.start is None else int(where.start)
            stop = start + len(slots) if where.stop is None else int(where.stop)
            if stop - start != len(slots):
                raise ValueError(f"slice {start}:{stop} does not fit {len(slots)} values")
        else:
            start = int(where)
        self.engine.apply(Assign(row, start, tuple(slots)))

    # -- keep the tensor in step with the core --------------------------------
    def _mirror(self, event: Event, state: State) -> None:
        # SGLang leaves stale slots in freed rows and past a row's end; so do we.
        if isinstance(event, Allocate):
            for request_id, slots in event.items:
                if isinstance(request_id, int) and slots:
                    stop = state.requests[request_id].allocated
                    self._write(request_id, stop - len(slots), slots)
        elif isinstance(event, Assign) and isinstance(event.request, int) and event.slots:
            self._write(event.request, event.start, event.slots)

    def _write(self, row: int, start: int, slots: tuple[int, ...]) -> None:
        self._table[row, start : start + len(slots)] = torch.tensor(slots, dtype=torch.int32)
