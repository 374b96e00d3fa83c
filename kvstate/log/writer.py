"""Writing logs: ``LogWriter`` (records to a file), ``make_header`` and ``write_log``.

``LogWriter`` owns its file and an in-memory buffer.  Records are appended
to the buffer whole and the buffer goes to the OS whenever it passes
``flush_bytes`` (and at every checkpoint when ``flush_on_checkpoint``), so a
process killed at any moment leaves only whole records plus at most one torn
one at the end, which the reader reports as truncation.  ``close`` writes
the end record, flushes and ``fsync``s.

The engine listener that feeds a ``LogWriter`` from a live run is
``kvstate.log.recorder.Recorder`` (re-exported here).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterable
from typing import Any

from kvstate.events import EVENT_TYPES, Event
from kvstate.log.format import (
    DEFAULT_CHECKPOINT_EVERY,
    FORMAT_VERSION,
    FRAME,
    LENGTH,
    LogHeader,
    checkpoint_body,
    end_body,
    make_encoders,
    new_packer,
    preamble,
)
from kvstate.log.initial import ReplayState, applier, initial_for, start_state
from kvstate.state import Geometry

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


# The engine listener moved to kvstate.log.recorder; re-exported for existing imports.
from kvstate.log.recorder import Recorder, engine_of  # noqa: E402

__all__ = ["LogWriter", "Recorder", "engine_of", "make_header", "write_log"]
