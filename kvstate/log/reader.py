"""``LogReader``: stream a log's records in constant memory, or fail at an exact byte.

The reader pulls the file in fixed-size chunks and holds at most one chunk
plus one record (itself capped at ``max_record_bytes``) and that record's
decoded events (one, or the events of an event block, all validated before the
first is yielded; each is yielded with the block's offset), so a multi-
gigabyte log replays in flat memory (docs/log-format.md, "Memory"). Every
malformed input -- empty, truncated anywhere, a flipped bit, wrong magic, a
future format, an unknown tag, a bad field, an oversized length, a missing end
record, bytes after the end, a geometry beyond ``limits`` -- raises
``LogFormatError`` with the byte offset and the reason; no other exception
type escapes for bad bytes.

In a format 2 or 3 log the reader keeps a running blake2b over every byte it
reads and compares it with the digest each checkpoint and the end record
carry.  A mismatch is not a format error (the frames are well formed): the
first broken interval is kept in ``digest_failure`` and reading goes on;
``kvstate.replay`` reports it.  ``salvage=True`` turns the first format
error into a clean stop: the records before it are yielded and
``reader.stopped`` holds the error.  The reader owns its file handle when
given a path (close it, or use ``with``).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from typing import IO

from kvstate.events import Event, EventDecodeError
from kvstate.events.codec import CODEC, Registry
from kvstate.log.digest import DigestBreak, DigestTracker
from kvstate.log.format import (
    BLOCK_PREFIX,
    CHECKPOINT_TAG,
    END_TAG,
    FORMAT_VERSION,
    FRAME,
    LENGTH,
    MAGIC,
    MAX_BLOCK_EVENTS,
    MAX_HEADER_BYTES,
    MAX_RECORD_BYTES,
    MIN_BLOCK_FORMAT,
    PREAMBLE_SIZE,
    VERSION_FIELD,
    Checkpoint,
    EndRecord,
    LogFormatError,
    LogHeader,
    block_count,
    decode_framing,
    parse_header,
    unpack_body,
)
from kvstate.log.limits import DEFAULT_LIMITS, Limits

# A framing record's body is an array whose first element is the "#c" or "#e" tag.
_FRAMING_TAGS = (b"\xa2" + CHECKPOINT_TAG.encode(), b"\xa2" + END_TAG.encode())

CHUNK_BYTES = 1 << 20
_LENGTH_SEEDS = [zlib.crc32(LENGTH.pack(length)) for length in range(1024)]  # crc32 of the length
Item = Event | Checkpoint | EndRecord


class LogReader:
    """Reads the header on construction; iterate :meth:`records` or :meth:`events` once."""

    def __init__(self, source: str | os.PathLike[str] | IO[bytes], *, salvage: bool = False,
                 max_record_bytes: int = MAX_RECORD_BYTES, upcasters: Registry | None = None,
                 chunk_bytes: int = CHUNK_BYTES, limits: Limits = DEFAULT_LIMITS) -> None:
        if isinstance(source, (str, os.PathLike)):
            self._file: IO[bytes] = open(source, "rb")  # noqa: SIM115 - owned, closed in close()
            self._owns = True
        else:
            self._file = source
            self._owns = False
        self.salvage = salvage
        self.max_record_bytes = max_record_bytes
        self.upcasters = upcasters
        self.limits = limits
        self._chunk = chunk_bytes
        self._buf = b""
        self._pos = 0  # index of the next unread byte in _buf
        self._base = 0  # file offset of _buf[0]
        self._eof = False
        self._digest: DigestTracker | None = None  # format 2 and later
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

    @property
    def digests(self) -> str:
        """``verified`` (every digest read so far matched), ``broken`` or ``unverified``
        (a format 1 log, which has none)."""
        if self._digest is None:
            return "unverified"
        return "broken" if self._digest.failure is not None else "verified"

    @property
    def digest_failure(self) -> DigestBreak | None:
        """The first checkpoint interval whose bytes do not match its digest, if any."""
        return None if self._digest is None else self._digest.failure

    @property
    def digests_verified(self) -> int:
        return 0 if self._digest is None else self._digest.verified

    # -- buffered access -----------------------------------------------------
    def _fill(self, need: int) -> bool:
        """Make ``need`` bytes available at ``_pos``; False if the file ends first."""
        have = len(self._buf) - self._pos
        if have >= need:
            return True
        if self._digest is not None:  # the bytes about to be dropped were read: hash them
            self._digest.feed(self._buf, self._base, self._base + self._pos)
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
        header = parse_header(unpack_body(body, PREAMBLE_SIZE), version, PREAMBLE_SIZE,
                              self.limits)
        self.offset = self._base + self._pos
        if version >= 2:
            self._digest = DigestTracker(version, body)
        return header

    def _fill_frame(self, limit: int, what: str) -> tuple[int, int]:
        """Make the whole frame at ``_pos`` available (``LogFormatError`` when it is torn or
        over ``limit``); its length and CRC."""
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
        return length, crc

    def _read_frame(self, limit: int, what: str) -> bytes:
        start = self._base + self._pos
        length, crc = self._fill_frame(limit, what)
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
        before them, the end record the total, and nothing follows it.  The
        events of one event block share the block's offset.
        """
        for start, run in self.runs():
            if type(run) is list:
                for event in run:
                    yield start, event
            else:
                yield start, run  # type: ignore[misc]

    def runs(self) -> Iterator[tuple[int, list[Event] | Checkpoint | EndRecord]]:
        """``(byte offset, events)`` for each event record (an event block's events, whole and
        validated, or one event in a list), ``(byte offset, item)`` for each checkpoint and
        the end record: :meth:`records` without a step per event, for a consumer (replay)
        that loops over the events itself."""
        return self._salvaged() if self.salvage else self._runs()

    def _salvaged(self) -> Iterator[tuple[int, list[Event] | Checkpoint | EndRecord]]:
        try:
            yield from self._runs()
        except LogFormatError as exc:
            self.stopped = exc

    def _runs(self) -> Iterator[tuple[int, list[Event] | Checkpoint | EndRecord]]:
        limit = self.max_record_bytes
        crc32 = zlib.crc32
        seeds = _LENGTH_SEEDS
        pack_length = LENGTH.pack
        read_frame = FRAME.unpack_from
        decode = self._decode
        # The codec's fast path, inlined: a record with the exact shape of the current
        # version of its event decodes straight into the struct; anything else (and
        # every error) goes through _decode for the full treatment.
        plain_of = CODEC._from_record.get
        typed = CODEC._decoder.decode
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
                seed = seeds[length] if length < 1024 else crc32(pack_length(length))
                if crc32(body, seed) != crc:
                    self._pos = pos
                    raise LogFormatError(start, "CRC mismatch in record (corrupted bytes)",
                                         self.records_read)
                pos = self._pos = end
                if body[:5] == BLOCK_PREFIX:
                    events = self._block(body, start)
                    self.records_read += 1
                    self.events_read += len(events)
                    self.offset = base + end
                    yield start, events
                    continue
                plain = plain_of(body[:5])
                item: Item | None = None
                if plain is not None:
                    try:
                        item = typed(b"".join((plain, memoryview(body)[5:])))
                        self.events_read += 1
                    except Exception:  # noqa: BLE001 - _decode below names the error
                        item = None
                if item is None:
                    item = decode(body, start)
                self.records_read += 1
                self.offset = base + end
                if isinstance(item, Event):
                    yield start, [item]
                    continue
                yield start, item
                if type(item) is EndRecord:
                    self._after_end()
                    return
            # Slow path: a frame that straddles the buffer end (or a bad length) is read in
            # whole, or refused; the fast path then decodes it.
            self._pos = pos
            if self._at_eof():
                raise LogFormatError(base + pos, "log ends without an end record (truncated, or "
                                                 "the writer did not finish)", self.records_read)
            self._fill_frame(limit, "record")

    def _after_end(self) -> None:
        if not self._at_eof():
            raise LogFormatError(self._base + self._pos, "bytes after the end record",
                                 self.records_read)

    def _block(self, body: bytes, start: int) -> list[Event]:
        """The events of an event block (all validated before the first is yielded)."""
        if self.header.format_version < MIN_BLOCK_FORMAT:
            raise LogFormatError(start, f"an event block in a format {self.header.format_version} "
                                        f"log (blocks exist from format {MIN_BLOCK_FORMAT})",
                                 self.records_read)
        count = block_count(body)
        if count is None or not 1 <= count <= MAX_BLOCK_EVENTS:
            raise LogFormatError(start, "event block must be [\"#b\", 1, [event, ...]] with 1 to "
                                        f"{MAX_BLOCK_EVENTS} events", self.records_read)
        try:
            events = CODEC.decode_plain_list(memoryview(body)[5:], self.header.event_versions,
                                             self.upcasters)
        except EventDecodeError as exc:
            raise LogFormatError(start, f"event block: {exc}", self.records_read) from None
        except (RecursionError, OverflowError, MemoryError) as exc:  # defensive: never escape
            raise LogFormatError(start, f"event block cannot be decoded ({type(exc).__name__})",
                                 self.records_read) from None
        if len(events) != count:  # defensive: the typed decode read the same array header
            raise LogFormatError(start, "event block length does not match its header",
                                 self.records_read)
        return events

    def _decode(self, body: bytes, start: int) -> Item:
        """One record body: an event (validated by the event codec) or a framing record."""
        if body[:4] == BLOCK_PREFIX[:4]:
            raise LogFormatError(start, f"event block version {body[4:5].hex() or 'missing'} is "
                                        "not 1", self.records_read)
        if body[1:4] in _FRAMING_TAGS:
            item = decode_framing(body, start, self.header.format_version)
            self._check_framing(item, start)
            return item
        try:
            event = CODEC.decode(body, self.upcasters)
        except EventDecodeError as exc:
            raise LogFormatError(start, str(exc), self.records_read) from None
        except (RecursionError, OverflowError, MemoryError) as exc:  # defensive: never escape
            raise LogFormatError(start, f"record cannot be decoded ({type(exc).__name__})",
                                 self.records_read) from None
        self.events_read += 1
        return event

    def _check_framing(self, item: Checkpoint | EndRecord, start: int) -> None:
        is_end = type(item) is EndRecord
        count = item.count if is_end else item.seq  # type: ignore[union-attr]
        if count != self.events_read:
            what = "end record" if is_end else "checkpoint"
            raise LogFormatError(start, f"{what} says {count} events, "
                                        f"{self.events_read} were read", self.records_read)
        if self._digest is not None:
            self._digest.check(item.digest, self._buf, self._base, start, self.events_read,
                               "end record" if is_end else "checkpoint")
        if is_end:
            self.end = item  # type: ignore[assignment]

    def events(self) -> Iterator[Event]:
        """Only the events, in order (checkpoints and the end record are still validated)."""
        for _, run in self.runs():
            if type(run) is list:
                yield from run


def read_header(path: str | os.PathLike[str], *, limits: Limits = DEFAULT_LIMITS) -> LogHeader:
    with LogReader(path, limits=limits) as reader:
        return reader.header


def read_events(path: str | os.PathLike[str], *, salvage: bool = False,
                limits: Limits = DEFAULT_LIMITS) -> tuple[LogHeader, list[Event]]:
    """Header and every event of a (small) log, in memory; use ``LogReader`` for big ones."""
    with LogReader(path, salvage=salvage, limits=limits) as reader:
        return reader.header, list(reader.events())
