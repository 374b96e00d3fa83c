"""Writing logs: ``LogWriter`` (records to a file), ``make_header`` and ``write_log``.

``LogWriter`` owns its file and an in-memory buffer.  Events collect in a
pending list and are sealed into event blocks (format 3: one frame, one CRC
and one C-level encode for up to ``block_events`` events).  Records are
appended to the buffer whole and the buffer goes to the OS whenever it passes
``flush_bytes`` (and at every checkpoint when ``flush_on_checkpoint``), so a
process killed at any moment leaves only whole records plus at most one torn
one at the end, which the reader reports as truncation.  ``close`` writes
the end record, flushes and ``fsync``s.  The writer keeps a running blake2b
over every byte it writes; each checkpoint and the end record carry the
digest of the bytes before them (hashed in bulk, at a checkpoint or a flush,
so it costs about a nanosecond per byte and nothing per record).

The engine listener that feeds a ``LogWriter`` from a live run is
``kvstate.log.recorder.Recorder``.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable
from typing import Any

from kvstate.backends.live import LiveState
from kvstate.events import EVENT_TYPES, Event, validated
from kvstate.events.codec import CODEC
from kvstate.log.format import (
    BLOCK_EVENTS,
    BLOCK_PREFIX,
    DEFAULT_CHECKPOINT_EVERY,
    FORMAT_VERSION,
    FRAME,
    LENGTH,
    MAX_BLOCK_EVENTS,
    MAX_RECORD_BYTES,
    LogHeader,
    checkpoint_body,
    end_body,
    new_digest,
    new_packer,
    preamble,
)
from kvstate.state import Geometry, State, initial_state

DEFAULT_FLUSH_BYTES = 1 << 16


def _kvstate_version() -> str:
    try:
        from kvstate import __version__
    except ImportError:  # pragma: no cover - only during a partial install
        return "unknown"
    return str(__version__)


def make_header(geometry: Geometry, *, checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
                meta: dict[str, Any] | None = None, host_pages: int = 0,
                swa_pages: int = 0, mamba_slots: int = 0) -> LogHeader:
    """The header of a run that starts empty (with a host tier of ``host_pages`` when > 0,
    an SWA pool of ``swa_pages`` when > 0, a Mamba pool of ``mamba_slots`` when > 0)."""
    return LogHeader(
        geometry=geometry,
        format_version=FORMAT_VERSION,
        kvstate_version=_kvstate_version(),
        checkpoint_every=checkpoint_every,
        initial_fingerprint=initial_state(geometry, host_pages=host_pages, swa_pages=swa_pages,
                                          mamba_slots=mamba_slots).fingerprint(),
        event_versions={tag: cls.VERSION for tag, cls in EVENT_TYPES.items()},
        meta=dict(meta or {}),
        host_pages=host_pages,
        swa_pages=swa_pages,
        mamba_slots=mamba_slots,
    )


def check_block_events(block_events: object) -> None:
    """``ValueError`` unless ``block_events`` is an int in ``1..MAX_BLOCK_EVENTS``."""
    if isinstance(block_events, bool) or not isinstance(block_events, int) \
            or not 1 <= block_events <= MAX_BLOCK_EVENTS:
        raise ValueError(f"block_events must be an int in 1..{MAX_BLOCK_EVENTS}, "
                         f"got {block_events!r}")


class LogWriter:
    """Appends framed records to ``path`` (created or truncated).  Mutates itself and the file.

    Events wait in ``pending`` and go out as one event block of up to
    ``block_events`` events (sealed also at every checkpoint, flush and close):
    one C call encodes the whole block and one CRC covers it.  A caller may
    append to ``pending`` directly and call :meth:`seal` itself (the recorder
    does); ``count`` counts pending events too.
    """

    def __init__(self, path: str | os.PathLike[str], header: LogHeader, *,
                 flush_bytes: int = DEFAULT_FLUSH_BYTES, flush_on_checkpoint: bool = True,
                 fsync: bool = True, block_events: int = BLOCK_EVENTS) -> None:
        check_block_events(block_events)
        self.path = os.fspath(path)
        self.header = header
        self.flush_bytes = flush_bytes
        self.flush_on_checkpoint = flush_on_checkpoint
        self.fsync = fsync
        self.block_events = block_events
        self.sealed = 0  # events written into frames
        self.pending: list[Event] = []  # events not yet in a block (anyone may append)
        self.closed = False
        if header.format_version != FORMAT_VERSION:
            raise ValueError(f"this kvstate writes format {FORMAT_VERSION} only, not "
                             f"{header.format_version}")
        self._packer = new_packer()
        self._digest = new_digest()
        self._hashed = 0  # bytes of _buf the digest has seen (anyone may append to _buf)
        self._file = open(self.path, "wb", buffering=0)  # noqa: SIM115 - closed in close()
        self._buf = bytearray(preamble(header))
        self.flush()

    @property
    def count(self) -> int:
        """Events written or pending."""
        return self.sealed + len(self.pending)

    # -- records --------------------------------------------------------------
    def write_event(self, evt: Event) -> None:
        if self.closed:
            raise ValueError(f"the log writer of {self.path} is closed")
        pending = self.pending
        pending.append(evt)
        if len(pending) >= self.block_events:
            self.seal()

    def write_events(self, events: Iterable[Event]) -> None:
        for evt in events:
            self.write_event(evt)

    def seal(self) -> None:
        """Write the pending events as event blocks (none when nothing is pending)."""
        self._seal_pending()
        if len(self._buf) >= self.flush_bytes:
            self.flush()

    def _seal_pending(self) -> None:
        pending = self.pending
        if pending:
            if self.closed:
                raise ValueError(f"the log writer of {self.path} is closed")
            bodies = [body for start in range(0, len(pending), MAX_BLOCK_EVENTS)
                      for body in _block_bodies(pending[start:start + MAX_BLOCK_EVENTS])]
            for body in bodies:  # all encoded before any is appended
                self._write_body(body)
            self.sealed += len(pending)
            pending.clear()

    def write_checkpoint(self, fingerprint: bytes) -> None:
        """The fingerprint of the state after the events written so far."""
        self._seal_pending()
        self._write_body(checkpoint_body(self._packer, self.count, fingerprint, self.digest()))
        if self.flush_on_checkpoint:
            self.flush()

    def digest(self) -> bytes:
        """blake2b-128 of every byte written so far (buffered ones included; pending events
        are not bytes yet)."""
        self._digest.update(memoryview(self._buf)[self._hashed:])
        self._hashed = len(self._buf)
        return self._digest.digest()  # type: ignore[no-any-return]

    def _write_body(self, body: bytes | bytearray) -> None:
        length = len(body)
        self._buf += FRAME.pack(length, zlib.crc32(body, zlib.crc32(LENGTH.pack(length))))
        self._buf += body

    # -- lifecycle ----------------------------------------------------------------
    def flush(self) -> None:
        """Seal the pending events and hand the buffered records to the OS (they survive a
        crash of this process)."""
        self._seal_pending()
        self._write_out()

    def _write_out(self) -> None:
        """Hand the buffered frames to the OS."""
        if self._buf:
            self._digest.update(memoryview(self._buf)[self._hashed:])
            self._hashed = 0
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
            try:
                self._seal_pending()
            except BaseException:
                self._write_out()  # the blocks sealed before reach the file all the same
                raise
            if final_fingerprint is not None:
                self._write_body(end_body(self._packer, self.count, final_fingerprint,
                                          self.digest()))
            self.flush()
            if self.fsync:
                os.fsync(self._file.fileno())
        finally:
            self.closed = True
            self._file.close()

    def abandon(self) -> None:
        """Flush what is buffered and close without an end record (the log reads as truncated).

        When a pending event cannot be encoded, the events before it are kept and the log
        ends there."""
        try:
            self._seal_pending()
        except Exception:  # noqa: BLE001 - whatever broke the encoding, the rest must reach disk
            self.pending[:] = self.pending[:_encodable_prefix(self.pending)]
            self._seal_pending()
        self.close(None)


def _encodable_prefix(events: list[Event]) -> int:
    """How many of ``events``, from the first, encode within the record limit."""
    for index, event in enumerate(events):
        try:
            _block_bodies([event])
        except Exception:  # noqa: BLE001 - any encoding failure ends the prefix
            return index
    return len(events)


def _block_bodies(events: list[Event]) -> list[bytearray]:
    """Event block bodies for ``events`` (at most ``MAX_BLOCK_EVENTS``): one, or more when
    one would pass the record limit.  ``ValueError`` for one event that alone passes it (no
    reader would read the log)."""
    body = bytearray(BLOCK_PREFIX)
    CODEC.encode_plain_list(events, body)
    if len(body) <= MAX_RECORD_BYTES:
        return [body]
    if len(events) == 1:
        raise ValueError(f"{type(events[0]).__name__} encodes to {len(body)} bytes, over the "
                         f"{MAX_RECORD_BYTES}-byte record limit of a log")
    half = len(events) // 2
    return _block_bodies(events[:half]) + _block_bodies(events[half:])


def write_log(path: str | os.PathLike[str], geometry: Geometry, events: Iterable[Event], *,
              checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY, meta: dict[str, Any] | None = None,
              end: bool = True, host_pages: int = 0, swa_pages: int = 0,
              mamba_slots: int = 0) -> State:
    """Write a whole log by applying ``events`` to the initial state (they must be valid).

    With ``host_pages`` the run has a host tier (offload, load and host-free
    events allowed).  Checkpoints carry the real fingerprints; returns the
    final state.
    """
    header = make_header(geometry, checkpoint_every=checkpoint_every, meta=meta,
                         host_pages=host_pages, swa_pages=swa_pages, mamba_slots=mamba_slots)
    writer = LogWriter(path, header, fsync=False)
    live = LiveState.empty(geometry, host_pages=host_pages, swa_pages=swa_pages,
                           mamba_slots=mamba_slots)
    try:
        for evt in events:
            evt = validated(evt)
            live.apply(evt)
            writer.write_event(evt)
            if checkpoint_every and writer.count % checkpoint_every == 0:
                writer.write_checkpoint(live.fingerprint())
    except BaseException:
        writer.abandon()
        raise
    writer.close(live.fingerprint() if end else None)
    return live.freeze()


__all__ = ["LogWriter", "make_header", "write_log"]
