"""``CallBatch``: the engine batch of one vLLM manager call, opened at its first event.

Most manager calls in a decode step commit nothing (no block fills, none
leaves the window): for them the planner only reads.  ``CallBatch`` is the
builder such a call hands the planner (``state`` to read, ``emit`` to apply,
``kvstate.planner.builder.Builder``): the engine batch is opened by the first
``emit`` and committed when the ``with`` block ends, so a call that decides
nothing costs no batch.  A call that emits keeps the engine's batch contract
unchanged: its events are applied whole or rolled back, and listeners see
them once, after the last.

It also offers the request's block hashes to the pool's ``NodeHashes`` for
the call (withdrawn at the end, also on an error), so the listener never
rehashes a block the request already hashed.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

from kvstate.engine import Batch, Engine
from kvstate.events import Event
from kvstate.vllm.events_bridge import NodeHashes


class CallBatch:
    """``with CallBatch(engine, hashes, request) as b:`` run one planner decision."""

    __slots__ = ("_batch", "_engine", "_hashes", "_persistent", "_request", "emit", "state")

    def __init__(self, engine: Engine, hashes: NodeHashes | None = None,
                 request: Any = None) -> None:
        self._engine = engine
        self._batch: Batch | None = None
        self._hashes = hashes if request is not None else None
        self._request = request
        self.state: Any = engine.view
        self._persistent = engine.backend != "live"  # a new state per event: read it again
        # ``emit`` is the opening method until the batch is open; on the live backend it then
        # becomes the engine's own ``emit`` (no frame of ours per event).  The bound method
        # refers back to this object: ``__exit__`` breaks that cycle.
        self.emit: Callable[[Event], None] = self._open_and_emit

    def __enter__(self) -> CallBatch:
        hashes = self._hashes
        if hashes is not None:
            request = self._request
            hashes.hints = request.block_hashes
            hashes.lora_id = getattr(request, "lora_id", None)
        return self

    def _open_and_emit(self, event: Event) -> None:
        engine = self._engine
        if self._batch is None:
            batch = engine.batch()
            batch.__enter__()
            self._batch = batch
            if not self._persistent:
                self.emit = engine.emit
        engine.emit(event)
        if self._persistent:
            self.state = engine.view

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        try:
            if self._batch is not None:
                self._batch.__exit__(kind, error, trace)
        finally:
            self._batch = None
            self.emit = _closed
            if self._hashes is not None:
                self._hashes.hints = None
                self._hashes.lora_id = None


def _closed(event: Event) -> None:
    raise RuntimeError("this manager call's batch is closed")
