"""Writing logs: ``LogWriter`` (records to a file) and ``Recorder`` (an engine listener).

``LogWriter`` owns its file and an in-memory buffer.  Records are appended
to the buffer whole and the buffer goes to the OS whenever it passes
``flush_bytes`` (and at every checkpoint when ``flush_on_checkpoint``), so a
process killed at any moment leaves only whole records plus at most one torn
one at the end, which the reader reports as truncation.  ``close`` writes
the end record, flushes and ``fsync``s.

``Recorder`` subscribes a ``LogWriter`` to an :class:`kvstate.engine.Engine`
(or any front end object with an ``.engine``: the SGLang pool, allocator and
cache share one) and appends every event as it is applied, a checkpoint
every ``checkpoint_every`` events and the end record on close.  The header is
written when the first event arrives, so the SGLang objects may still size
the engine after the recorder is attached.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterable
from typing import Any

from kvstate.engine import Engine
from kvstate.events import EVENT_TYPES, Event
from kvstate.log.format import (
    DEFAULT_CHECKPOINT_EVERY,
    FORMAT_VERSION,
    FRAME,
    LENGTH,
    LogHeader,
    auto_checkpoint_every,
    checkpoint_body,
    end_body,
    make_encoders,
    new_packer,
    preamble,
)
from kvstate.log.initial import ReplayState, applier, initial_for, start_state
from kvstate.state import Geometry, State, initial_state

DEFAULT_FLUSH_BYTES = 1 << 16


def _kvstate_version() -> str:
    try:
        from kvstate import __version__
    except ImportError:  # pragma: no cover - only during a partial install
        return "unknown"
    return str(__version__)


def make_header(geometry: Geometry, *, checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
                meta: dict[str, Any] | None = None, host_pages: int = 0) -> LogHeader:
    """The header of a run that starts empty (with a host tier of ``host_pages`` when > 0)."""
    return LogHeader(
        geometry=geometry,
        format_version=FORMAT_VERSION,
        kvstate_version=_kvstate_version(),
        checkpoint_every=checkpoint_every,
        initial_fingerprint=initial_for(geometry, host_pages).fingerprint(),
        event_versions={tag: cls.VERSION for tag, cls in EVENT_TYPES.items()},
        meta=dict(meta or {}),
        host_pages=host_pages,
    )


class LogWriter:
    """Appends framed records to ``path`` (created or truncated).  Mutates itself and the file."""

    def __init__(self, path: str | os.PathLike[str], header: LogHeader, *,
                 flush_bytes: int = DEFAULT_FLUSH_BYTES, flush_on_checkpoint: bool = True,
                 fsync: bool = True) -> None:
        self.path = os.fspath(path)
        self.header = header
        self.flush_bytes = flush_bytes
        self.flush_on_checkpoint = flush_on_checkpoint
        self.fsync = fsync
        self.count = 0  # events written
        self.closed = False
        self._packer = new_packer()
        self._encoders = make_encoders(self._packer.pack)
        self._file = open(self.path, "wb", buffering=0)  # noqa: SIM115 - closed in close()
        self._buf = bytearray(preamble(header))
        self.flush()

    # -- records --------------------------------------------------------------
    def encoder(self, cls: type[Event]) -> Callable[[Event], bytes]:
        """The body encoder for an event type (``TypeError`` if it is not registered)."""
        encode = self._encoders.get(cls)
        if encode is None:
            if cls.TAG not in EVENT_TYPES or EVENT_TYPES[cls.TAG] is not cls:
                raise TypeError(f"{cls.__name__} is not a registered event type")
            self._encoders = make_encoders(self._packer.pack)  # registered after we started
            encode = self._encoders[cls]
        return encode

    def write_event(self, evt: Event) -> None:
        encode = self._encoders.get(evt.__class__) or self.encoder(evt.__class__)
        body = encode(evt)
        length = len(body)
        buf = self._buf
        buf += FRAME.pack(length, zlib.crc32(body, zlib.crc32(LENGTH.pack(length))))
        buf += body
        self.count += 1
        if len(buf) >= self.flush_bytes:
            self.flush()

    def write_events(self, events: Iterable[Event]) -> None:
        for evt in events:
            self.write_event(evt)

    def write_checkpoint(self, fingerprint: bytes) -> None:
        """The fingerprint of the state after the events written so far."""
        self._write_body(checkpoint_body(self._packer, self.count, fingerprint))
        if self.flush_on_checkpoint:
            self.flush()

    def _write_body(self, body: bytes) -> None:
        length = len(body)
        self._buf += FRAME.pack(length, zlib.crc32(body, zlib.crc32(LENGTH.pack(length))))
        self._buf += body

    # -- lifecycle ----------------------------------------------------------------
    def flush(self) -> None:
        """Hand the buffered records to the OS (they survive a crash of this process)."""
        if self._buf:
            view = memoryview(self._buf)
            written = 0
            while written < len(view):
                written += self._file.write(view[written:]) or 0
            view.release()
            self._buf.clear()

    def close(self, final_fingerprint: bytes | None = None) -> None:
        """Write the end record (when ``final_fingerprint`` is given), flush, fsync, close."""
        if self.closed:
            return
        try:
            if final_fingerprint is not None:
                self._write_body(end_body(self._packer, self.count, final_fingerprint))
            self.flush()
            if self.fsync:
                os.fsync(self._file.fileno())
        finally:
            self.closed = True
            self._file.close()

    def abandon(self) -> None:
        """Flush what is buffered and close without an end record (the log reads as truncated)."""
        self.close(None)


def write_log(path: str | os.PathLike[str], geometry: Geometry, events: Iterable[Event], *,
              checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY, meta: dict[str, Any] | None = None,
              end: bool = True, host_pages: int = 0) -> ReplayState:
    """Write a whole log by applying ``events`` to the initial state (they must be valid).

    With ``host_pages`` the run has a host tier (a ``TieredState``; offload,
    load and host-free events allowed).  Checkpoints carry the real
    fingerprints; returns the final state.
    """
    header = make_header(geometry, checkpoint_every=checkpoint_every, meta=meta,
                         host_pages=host_pages)
    apply = applier(header)
    writer = LogWriter(path, header, fsync=False)
    state = start_state(header)
    try:
        for evt in events:
            state = apply(state, evt)
            writer.write_event(evt)
            if checkpoint_every and writer.count % checkpoint_every == 0:
                writer.write_checkpoint(state.fingerprint())
    except BaseException:
        writer.abandon()
        raise
    writer.close(state.fingerprint() if end else None)
    return state


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
