"""``Recorder``: an engine listener that writes every applied event into a log.

``Recorder`` subscribes a ``LogWriter`` to an :class:`kvstate.engine.Engine`
(or any front end object with an ``.engine``: the SGLang pool, allocator and
cache share one; so do the seed-002 and vLLM front ends) and appends every
event as it is applied, a checkpoint every ``checkpoint_every`` events and
the end record on close.  The header is written when the first event
arrives, so the SGLang objects may still size the engine after the recorder
is attached.  The recorder owns its writer and file; it never changes the
engine beyond subscribing and unsubscribing its listener.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from typing import Any

from kvstate.engine import Engine
from kvstate.events import Event
from kvstate.log.format import FRAME, LENGTH, auto_checkpoint_every
from kvstate.log.writer import DEFAULT_FLUSH_BYTES, LogWriter, make_header
from kvstate.state import State, initial_state


def engine_of(target: Any) -> Engine:
    """The engine behind a front end object (or the engine itself)."""
    if isinstance(target, Engine):
        return target
    engine = getattr(target, "engine", None)
    if not isinstance(engine, Engine):
        raise TypeError(f"{type(target).__name__} is neither an Engine nor a front end with .engine")
    return engine


class Recorder:
    """Records every event an engine applies into a log at ``path``.

    Use as a context manager, or call :meth:`close` (writes the end record
    with the engine's current fingerprint, fsyncs).  If the engine already
    applied events, they are written first (the engine must have kept them).
    """

    def __init__(self, target: Any, path: str | os.PathLike[str], *,
                 checkpoint_every: int | None = None,
                 flush_bytes: int = DEFAULT_FLUSH_BYTES, flush_on_checkpoint: bool = True,
                 meta: dict[str, Any] | None = None, fsync: bool = True) -> None:
        if checkpoint_every is not None and checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, got {checkpoint_every}")
        self.engine = engine_of(target)
        self.path = os.fspath(path)
        self._checkpoint_every = checkpoint_every
        self._options = {"flush_bytes": flush_bytes, "flush_on_checkpoint": flush_on_checkpoint,
                         "fsync": fsync}
        self.meta = dict(meta or {})
        self.writer: LogWriter | None = None
        with open(self.path, "wb"):  # fail now, not inside an engine callback, on a bad path
            pass
        history = self._history()
        self._on_event = self._make_listener()
        self.engine.subscribe(self._on_event)
        self._attached = True
        if history:
            state = self.engine.initial_state
            from kvstate.reducer import apply

            for evt in history:
                state = apply(state, evt)
                self._on_event(evt, state)

    def _history(self) -> list[Event]:
        engine = self.engine
        if engine.state.seq == 0:
            return []
        events = list(engine.events)
        if len(events) != engine.state.seq - engine.initial_state.seq:
            raise ValueError("the engine applied events it did not keep; attach the recorder "
                             "before the first event")
        if engine.initial_state != initial_state(engine.geometry):
            raise ValueError("the engine did not start from an empty state; a log cannot express it")
        return events

    @property
    def checkpoint_every(self) -> int:
        """The interval asked for, or the automatic one for the engine's geometry."""
        if self._checkpoint_every is not None:
            return self._checkpoint_every
        return auto_checkpoint_every(self.engine.geometry)

    def _open(self) -> LogWriter:
        header = make_header(self.engine.geometry, checkpoint_every=self.checkpoint_every,
                             meta=self.meta)
        self.writer = LogWriter(self.path, header, **self._options)  # type: ignore[arg-type]
        return self.writer

    def _make_listener(self) -> Callable[[Event, State], None]:
        """The engine listener: opens the writer on the first event, then appends records.

        The hot path is one closure with every lookup bound to a local (this
        is what the per-event recording cost is made of).
        """
        recorder = self
        crc32 = zlib.crc32
        frame_pack = FRAME.pack
        length_pack = LENGTH.pack
        every = 0
        writer: LogWriter | None = None
        encoders: dict[type[Event], Callable[[Event], bytes]] = {}
        extend: Callable[[bytes], None] = bytearray().extend
        buf = bytearray()
        limit = 0
        next_checkpoint = -1
        length_crcs = [crc32(length_pack(length)) for length in range(1024)]

        def listener(evt: Event, state: State) -> None:
            nonlocal writer, encoders, extend, buf, limit, every, next_checkpoint
            if writer is None:
                # First event: the geometry is final now (front ends size the engine lazily).
                writer = recorder.writer or recorder._open()
                encoders, buf, limit = writer._encoders, writer._buf, writer.flush_bytes
                extend = buf.extend
                every = writer.header.checkpoint_every
                next_checkpoint = (writer.count // every + 1) * every if every else -1
            encode = encoders.get(evt.__class__) or writer.encoder(evt.__class__)
            body = encode(evt)
            length = len(body)
            seed = length_crcs[length] if length < 1024 else crc32(length_pack(length))
            extend(frame_pack(length, crc32(body, seed)))
            extend(body)
            count = writer.count = writer.count + 1
            if count == next_checkpoint:
                writer.write_checkpoint(state.fingerprint())
                next_checkpoint += every
            if len(buf) >= limit:
                writer.flush()

        return listener

    @property
    def count(self) -> int:
        return 0 if self.writer is None else self.writer.count

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        """Detach, write the end record with the engine's fingerprint, fsync and close."""
        if self._attached:
            self.engine.unsubscribe(self._on_event)
            self._attached = False
        writer = self.writer or self._open()
        writer.close(self.engine.state.fingerprint())

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
