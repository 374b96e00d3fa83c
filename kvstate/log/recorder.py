"""``Recorder``: an engine listener that writes every committed event into a log.

``Recorder`` subscribes a ``LogWriter`` to an :class:`kvstate.engine.Engine`
(or any front end object with an ``.engine``: the SGLang pool, allocator and
cache share one; so do the seed-002 and vLLM front ends).  It receives each
committed batch whole and hands its events to the writer, which seals them
into event blocks (a block ends at a batch boundary unless one batch alone
passes a block's limits, so a batch is in the log entirely or not at all; the
events are immutable, so holding them until the block is sealed is safe),
writes a checkpoint at the end
of the first batch that reaches each ``checkpoint_every`` boundary (a
checkpoint always fingerprints a state some decision left, never one in the
middle of a decision), and the end record on close.  The header is written
when the first batch arrives, so the SGLang objects may still size the
engine after the recorder is attached.

If encoding or writing ever fails, the recorder stops (``failed`` holds the
error, which the engine raises to the caller after detaching it); the blocks
sealed before stay on disk and ``close`` flushes it without an end record,
so the log reads as truncated and ``replay --salvage`` replays it.  The
recorder owns its writer and file; it never changes the engine beyond
subscribing and unsubscribing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from kvstate.canonical import fingerprint
from kvstate.engine import Engine
from kvstate.events import Event
from kvstate.log.format import BLOCK_EVENTS, auto_checkpoint_every
from kvstate.log.writer import DEFAULT_FLUSH_BYTES, LogWriter, check_block_events, make_header
from kvstate.state import initial_state


def engine_of(target: Any) -> Engine:
    """The engine behind a front end object (or the engine itself)."""
    if isinstance(target, Engine):
        return target
    engine = getattr(target, "engine", None)
    if not isinstance(engine, Engine):
        raise TypeError(f"{type(target).__name__} is neither an Engine nor a front end with .engine")
    return engine


class Recorder:
    """Records every event an engine commits into a log at ``path``.

    Use as a context manager, or call :meth:`close` (writes the end record
    with the engine's current fingerprint, fsyncs).  Events the engine
    applied before the recorder was attached are written first (the engine
    must have kept them and started from an empty state).
    """

    def __init__(self, target: Any, path: str | os.PathLike[str], *,
                 checkpoint_every: int | None = None,
                 flush_bytes: int = DEFAULT_FLUSH_BYTES, flush_on_checkpoint: bool = True,
                 meta: dict[str, Any] | None = None, fsync: bool = True,
                 block_events: int = BLOCK_EVENTS) -> None:
        if checkpoint_every is not None and (isinstance(checkpoint_every, bool)
                                             or checkpoint_every < 0):
            raise ValueError(f"checkpoint_every must be an int >= 0, got {checkpoint_every!r}")
        check_block_events(block_events)
        self.engine = engine_of(target)
        self.path = os.fspath(path)
        self._checkpoint_every = checkpoint_every
        self._options = {"flush_bytes": flush_bytes, "flush_on_checkpoint": flush_on_checkpoint,
                         "fsync": fsync, "block_events": block_events}
        self.meta = dict(meta or {})
        self.writer: LogWriter | None = None
        self.failed: BaseException | None = None
        self._next_checkpoint = -1
        self._pending: list[Event] = []  # the writer's pending list once it is open
        self._seal_at = 0  # the pending length at which ``after`` calls ``_seal``
        with open(self.path, "wb"):  # fail now, not inside an engine callback, on a bad path
            pass
        history = self._history()
        self.engine.subscribe(self)
        self._attached = True
        if history:
            self.after(history, self.engine.view)

    def _history(self) -> list[Event]:
        engine = self.engine
        if engine.seq == 0:
            return []
        events = list(engine.events)
        if len(events) != engine.seq - engine.initial_state.seq:
            raise ValueError("the engine applied events it did not keep; attach the recorder "
                             "before the first event")
        if engine.initial_state.seq != 0 or engine.initial_state.fingerprint() != _empty_of(engine):
            raise ValueError("the engine did not start from an empty state; a log cannot express it")
        return events

    @property
    def checkpoint_every(self) -> int:
        """The interval asked for, or the automatic one for the engine's geometry."""
        if self._checkpoint_every is not None:
            return self._checkpoint_every
        return auto_checkpoint_every(self.engine.geometry)

    def _open(self) -> LogWriter:
        initial = self.engine.initial_state
        host, swa, mamba = initial.host, initial.swa, initial.mamba
        header = make_header(self.engine.geometry, checkpoint_every=self.checkpoint_every,
                             meta=self.meta, host_pages=0 if host is None else host.num_pages,
                             swa_pages=0 if swa is None else swa.num_pages,
                             mamba_slots=0 if mamba is None else mamba.num_slots)
        self.writer = LogWriter(self.path, header, **self._options)  # type: ignore[arg-type]
        every = header.checkpoint_every
        self._next_checkpoint = every if every else -1
        return self.writer

    # -- the engine listener ----------------------------------------------------------
    def after(self, events: Sequence[Event], view: Any) -> None:
        """Append one committed batch (all of it or, on an error, none of it)."""
        if self.failed is not None:
            raise RuntimeError(f"the recorder stopped after an earlier error: {self.failed!r}")
        # Events are immutable: holding them until a block is sealed is safe, and one C
        # call then encodes the whole block.  Most batches stop here.
        pending = self._pending
        pending += events
        if len(pending) >= self._seal_at:
            self._seal(view)

    def _seal(self, view: Any) -> None:
        """Open the writer (first batch), then write the checkpoint that is due or seal the
        full block, and set the pending length at which to come back."""
        try:
            writer = self.writer
            if writer is None:
                writer = self._open()
                writer.pending += self._pending
                self._pending = writer.pending
            if self._next_checkpoint > 0 and writer.count >= self._next_checkpoint:
                writer.write_checkpoint(fingerprint(view))
                every = writer.header.checkpoint_every
                self._next_checkpoint = (writer.count // every + 1) * every
            elif len(writer.pending) >= writer.block_events:
                writer.seal()
            self._arm(writer)
        except BaseException as exc:
            self.failed = exc
            raise

    def _arm(self, writer: LogWriter) -> None:
        """The pending length at which ``after`` calls ``_seal`` next: a full block, or the
        next checkpoint (counted from the events the writer has sealed)."""
        seal_at = writer.block_events
        if self._next_checkpoint > 0:
            seal_at = min(seal_at, self._next_checkpoint - writer.sealed)
        self._seal_at = seal_at

    @property
    def count(self) -> int:
        return 0 if self.writer is None else self.writer.count

    def flush(self) -> None:
        """Seal the pending events and hand everything written to the OS."""
        if self.writer is not None:
            self.writer.flush()
            self._arm(self.writer)  # the seal moved the count the next checkpoint is due at

    def close(self) -> None:
        """Detach and finish the log: the end record with the engine's fingerprint, fsync.

        After a failure it flushes what was written and leaves the end record
        off (the log reads as truncated), without raising again.
        """
        if self._attached:
            try:
                self.engine.unsubscribe(self)
            except ValueError:  # the engine already detached a failed recorder
                pass
            self._attached = False
        writer = self.writer or self._open()
        if self.failed is not None:
            writer.abandon()
            return
        writer.close(fingerprint(self.engine.view))

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _empty_of(engine: Engine) -> bytes:
    host, swa, mamba = engine.initial_state.host, engine.initial_state.swa, \
        engine.initial_state.mamba
    return initial_state(engine.geometry, host_pages=0 if host is None else host.num_pages,
                         swa_pages=0 if swa is None else swa.num_pages,
                         mamba_slots=0 if mamba is None else mamba.num_slots).fingerprint()
