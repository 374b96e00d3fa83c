"""``LogReader``: stream a log's records in constant memory, or fail at an exact byte.

The reader pulls the file in fixed-size chunks and never holds more than one
chunk plus one record (itself capped at ``max_record_bytes``), so a
multi-gigabyte log replays in flat memory.  Every malformed input -- empty,
truncated anywhere, a flipped bit, wrong magic, a future format, an unknown
tag, a bad field, an oversized length, a missing end record, bytes after the
end -- raises ``LogFormatError`` with the byte offset and the reason.

``salvage=True`` turns the first such error into a clean stop: the records
before it are yielded and ``reader.stopped`` holds the error.  The reader owns
its file handle when given a path (close it, or use ``with``).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from typing import IO

import msgpack

from kvstate.events import Event
from kvstate.log.decode import CURRENT, decode_record
from kvstate.log.format import (
    FORMAT_VERSION,
    FRAME,
    LENGTH,
    MAGIC,
    MAX_HEADER_BYTES,
    MAX_RECORD_BYTES,
    PREAMBLE_SIZE,
    VERSION_FIELD,
    Checkpoint,
    EndRecord,
    LogFormatError,
    LogHeader,
    parse_header,
    unpack_body,
)
from kvstate.log.upcast import Registry

CHUNK_BYTES = 1 << 20
Item = Event | Checkpoint | EndRecord


class LogReader:
    """Reads the header on construction; iterate :meth:`records` or :meth:`events` once."""

    def __init__(self, source: str | os.PathLike[str] | IO[bytes], *, salvage: bool = False,
                 max_record_bytes: int = MAX_RECORD_BYTES, upcasters: Registry | None = None,
                 chunk_bytes: int = CHUNK_BYTES) -> None:
        if isinstance(source, (str, os.PathLike)):
            self._file: IO[bytes] = open(source, "rb")  # noqa: SIM115 - owned, closed in close()
            self._owns = True
        else:
            self._file = source
            self._owns = False
        self.salvage = salvage
        self.max_record_bytes = max_record_bytes
        self.upcasters = upcasters
        self._chunk = chunk_bytes
        self._buf = b""
        self._pos = 0  # index of the next unread byte in _buf
        self._base = 0  # file offset of _buf[0]
        self._eof = False
        self.stopped: LogFormatError | None = None  # set in salvage mode when reading stopped early
        self.end: EndRecord | None = None
        self.events_read = 0
        self.records_read = 0
        self.offset = 0  # file offset just after the last complete record
        try:
            self.header = self._read_header()
        except BaseException:
            self.close()
            raise

    # -- lifecycle ----------------------------------------------------------
    def close(self) -> None:
        if self._owns:
            self._file.close()

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- buffered access -----------------------------------------------------
    def _fill(self, need: int) -> bool:
        """Make ``need`` bytes available at ``_pos``; False if the file ends first."""
        have = len(self._buf) - self._pos
        if have >= need:
            return True
        parts = [self._buf[self._pos:]]
        while have < need and not self._eof:
            chunk = self._file.read(max(self._chunk, need - have))
            if not chunk:
                self._eof = True
                break
            parts.append(chunk)
            have += len(chunk)
        self._base += self._pos
        self._buf = b"".join(parts)
        self._pos = 0
        return have >= need

    def _available(self) -> int:
        return len(self._buf) - self._pos

    def _at_eof(self) -> bool:
        return not self._fill(1)

    # -- header ---------------------------------------------------------------
    def _read_header(self) -> LogHeader:
        if not self._fill(PREAMBLE_SIZE):
            if self._available() == 0:
                raise LogFormatError(0, "empty file")
            if not MAGIC.startswith(self._buf[: len(MAGIC)]):
                raise LogFormatError(0, "wrong magic bytes: not a kvstate log")
            raise LogFormatError(self._available(), "truncated in the file preamble")
        if self._buf[: len(MAGIC)] != MAGIC:
            raise LogFormatError(0, "wrong magic bytes: not a kvstate log")
        (version,) = VERSION_FIELD.unpack_from(self._buf, len(MAGIC))
        if version > FORMAT_VERSION:
            raise LogFormatError(len(MAGIC), f"format version {version} is newer than this "
                                             f"reader ({FORMAT_VERSION}); upgrade kvstate")
        if version < 1:
            raise LogFormatError(len(MAGIC), f"format version {version} does not exist")
        self._pos = PREAMBLE_SIZE
        body = self._read_frame(MAX_HEADER_BYTES, "header")
        header = parse_header(unpack_body(body, PREAMBLE_SIZE), version, PREAMBLE_SIZE)
        self.offset = self._base + self._pos
        return header

    def _read_frame(self, limit: int, what: str) -> bytes:
        start = self._base + self._pos
        if not self._fill(FRAME.size):
            raise LogFormatError(start, f"truncated {what}: {self._available()} of "
                                        f"{FRAME.size} frame bytes", self.records_read)
        length, crc = FRAME.unpack_from(self._buf, self._pos)
        if length > limit:
            raise LogFormatError(start, f"{what} length {length} exceeds the {limit}-byte limit",
                                 self.records_read)
        if not self._fill(FRAME.size + length):
            raise LogFormatError(start, f"truncated {what}: {self._available() - FRAME.size} of "
                                        f"{length} body bytes", self.records_read)
        body_start = self._pos + FRAME.size
        body = self._buf[body_start: body_start + length]
        if zlib.crc32(body, zlib.crc32(LENGTH.pack(length))) != crc:
            raise LogFormatError(start, f"CRC mismatch in {what} (corrupted bytes)", self.records_read)
        self._pos = body_start + length
        return body

    # -- records ----------------------------------------------------------------
    def records(self) -> Iterator[tuple[int, Item]]:
        """``(byte offset, item)`` for every record through the end record.

        Checks the framing facts too: checkpoints carry the number of events
        before them, the end record the total, and nothing follows it.
        """
        return self._salvaged() if self.salvage else self._records()

    def _salvaged(self) -> Iterator[tuple[int, Item]]:
        try:
            yield from self._records()
        except LogFormatError as exc:
            self.stopped = exc

    def _records(self) -> Iterator[tuple[int, Item]]:
        limit = self.max_record_bytes
        upcasters = self.upcasters
        crc32 = zlib.crc32
        pack_length = LENGTH.pack
        read_frame = FRAME.unpack_from
        unpackb = msgpack.unpackb
        current = CURRENT
        while True:
            # Fast path: decode every whole frame already in the buffer.
            buf, pos, base = self._buf, self._pos, self._base
            buf_len = len(buf)
            while pos + 8 <= buf_len:
                length, crc = read_frame(buf, pos)
                end = pos + 8 + length
                if length > limit or end > buf_len:
                    break
                start = base + pos
                body = buf[pos + 8:end]
                if crc32(body, crc32(pack_length(length))) != crc:
                    self._pos = pos
                    raise LogFormatError(start, "CRC mismatch in record (corrupted bytes)",
                                         self.records_read)
                pos = self._pos = end
                try:
                    # unpackb bounds every str/bin/array/map/ext length by len(body) by default
                    # (msgpack >= 1.0); the record body itself is capped at max_record_bytes.
                    raw = unpackb(body, use_list=False)
                except Exception:  # noqa: BLE001 - re-raised as a typed error with the offset
                    raw = unpack_body(body, start)  # raises LogFormatError with the reason
                tag = raw[0] if type(raw) is tuple and len(raw) >= 2 else None
                entry = current.get(tag) if type(tag) is str else None
                if entry is not None and raw[1] is entry[0]:
                    item: Item = entry[1](raw[2:], start)
                    self.events_read += 1
                else:
                    item = decode_record(raw, start, upcasters)
                    if type(item) is EndRecord or type(item) is Checkpoint:
                        self._check_framing(item, start)  # type: ignore[arg-type]
                    else:
                        self.events_read += 1
                self.records_read += 1
                self.offset = base + end
                yield start, item
                if type(item) is EndRecord:
                    if not self._at_eof():
                        raise LogFormatError(self._base + self._pos, "bytes after the end record",
                                             self.records_read)
                    return
            # Slow path: one frame that straddles the buffer end (or a bad length).
            self._pos = pos
            start = base + pos
            if self._at_eof():
                raise LogFormatError(start, "log ends without an end record (truncated, or the "
                                            "writer did not finish)", self.records_read)
            body = self._read_frame(limit, "record")
            item = decode_record(unpack_body(body, start), start, upcasters)
            if isinstance(item, Event):
                self.events_read += 1
            else:
                self._check_framing(item, start)
            self.records_read += 1
            self.offset = self._base + self._pos
            yield start, item
            if isinstance(item, EndRecord):
                if not self._at_eof():
                    raise LogFormatError(self._base + self._pos, "bytes after the end record",
                                         self.records_read)
                return

    def _check_framing(self, item: Checkpoint | EndRecord, start: int) -> None:
        if isinstance(item, Checkpoint):
            if item.seq != self.events_read:
                raise LogFormatError(start, f"checkpoint says {item.seq} events, "
                                            f"{self.events_read} were read", self.records_read)
            return
        if item.count != self.events_read:
            raise LogFormatError(start, f"end record says {item.count} events, "
                                        f"{self.events_read} were read", self.records_read)
        self.end = item

    def events(self) -> Iterator[Event]:
        """Only the events, in order (checkpoints and the end record are still validated)."""
        for _, item in self.records():
            if isinstance(item, Event):
                yield item


def read_header(path: str | os.PathLike[str]) -> LogHeader:
    with LogReader(path) as reader:
        return reader.header


def read_events(path: str | os.PathLike[str], *, salvage: bool = False) -> tuple[LogHeader, list[Event]]:
    """Header and every event of a (small) log, in memory; use ``LogReader`` for big ones."""
    with LogReader(path, salvage=salvage) as reader:
        return reader.header, list(reader.events())
