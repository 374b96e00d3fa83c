"""``verify_log``: check a log's framing and digests without decoding one event.

What ``kvstate verify`` runs. It reads the file in large chunks and, per
frame, checks the length bound and the CRC (an event block's event count is
read from its array header); checkpoint and end records are decoded (typed)
and their counts and digests checked against a running blake2b over the bytes,
hashed a chunk at a time. Event bodies are never decoded and no state is
built, so the cost is one CRC per record plus one hash pass over the file
(docs/benchmarks-log.md has the numbers). It stops at the first format error
(``LogFormatError``, byte offset and reason); a digest mismatch is reported as
the first broken interval, as replay does. Owned by the log layer; reads only.
"""

from __future__ import annotations

import os
import zlib
from typing import NoReturn

import attrs

from kvstate.log.digest import DigestBreak
from kvstate.log.format import (
    CHECKPOINT_TAG,
    END_TAG,
    FRAME,
    LENGTH,
    MAX_BLOCK_EVENTS,
    MAX_RECORD_BYTES,
    MIN_BLOCK_FORMAT,
    Checkpoint,
    EndRecord,
    LogFormatError,
    block_count,
    decode_framing,
)
from kvstate.log.limits import DEFAULT_LIMITS, Limits
from kvstate.log.reader import LogReader

VERIFY_CHUNK_BYTES = 1 << 22
_FRAMING_TAGS = (b"\xa2" + CHECKPOINT_TAG.encode(), b"\xa2" + END_TAG.encode())
_LENGTH_SEEDS = [zlib.crc32(LENGTH.pack(length)) for length in range(4096)]


@attrs.frozen
class Verified:
    """What ``verify_log`` found: counts, and the first broken digest interval if any."""

    format_version: int
    bytes: int
    records: int
    events: int
    checkpoints: int
    digests: str  # "verified", "broken" or "unverified" (format 1: no digests)
    digests_verified: int
    digest_failure: DigestBreak | None


def verify_log(path: str | os.PathLike[str], *, limits: Limits = DEFAULT_LIMITS,
               max_record_bytes: int = MAX_RECORD_BYTES,
               chunk_bytes: int = VERIFY_CHUNK_BYTES) -> Verified:
    """Check ``path``'s framing and digests; ``LogFormatError`` at the first malformed frame."""
    with LogReader(path, limits=limits, max_record_bytes=max_record_bytes,
                   chunk_bytes=chunk_bytes) as reader:
        return _Scan(reader, max_record_bytes).run()


def _bad_block(format_version: int, count: int | None) -> str:
    if format_version < MIN_BLOCK_FORMAT:
        return (f"an event block in a format {format_version} log (blocks exist from format "
                f"{MIN_BLOCK_FORMAT})")
    return f'event block must be ["#b", 1, [event, ...]] with 1 to {MAX_BLOCK_EVENTS} events'


class _Scan:
    """One pass over the frames after the header, borrowing the reader's buffer and digest."""

    def __init__(self, reader: LogReader, limit: int) -> None:
        self.reader = reader
        self.limit = limit
        self.records = self.events = self.checkpoints = 0

    def run(self) -> Verified:
        reader = self.reader
        crc32, unpack, seeds = zlib.crc32, FRAME.unpack_from, _LENGTH_SEEDS
        limit = self.limit
        blocks_allowed = reader.header.format_version >= MIN_BLOCK_FORMAT
        while True:
            buf, pos, base = reader._buf, reader._pos, reader._base
            size = len(buf)
            events = records = 0
            framing_at = -1
            while pos + 8 <= size:
                length, crc = unpack(buf, pos)
                end = pos + 8 + length
                if length > limit or end > size:
                    break
                seed = seeds[length] if length < 4096 else crc32(LENGTH.pack(length))
                if crc32(buf[pos + 8:end], seed) != crc:
                    self._fail(records, pos, "CRC mismatch in record (corrupted bytes)")
                # Framing and block tags start with '#' (0x23) and no event tag does.
                if length > 3 and buf[pos + 10] == 0x23:
                    if buf[pos + 9:pos + 12] in _FRAMING_TAGS:
                        framing_at = pos
                        break
                    count = block_count(buf[pos + 8:min(end, pos + 18)])
                    if count is None or not 1 <= count <= MAX_BLOCK_EVENTS or not blocks_allowed:
                        self._fail(records, pos, _bad_block(reader.header.format_version, count))
                    events += count
                else:
                    events += 1
                records += 1
                pos = end
            self.events += events
            self.records += records
            reader._pos = pos
            if framing_at >= 0:
                if self._framing(base + framing_at):
                    return self._result()
                continue
            if reader._at_eof():
                raise LogFormatError(base + pos, "log ends without an end record (truncated, or "
                                                 "the writer did not finish)", self.records)
            if not reader._fill(8):
                raise LogFormatError(reader._base + reader._pos, "truncated record frame",
                                     self.records)
            length, _ = unpack(reader._buf, reader._pos)
            if length > limit:
                raise LogFormatError(reader._base + reader._pos, f"record length {length} "
                                     f"exceeds the {limit}-byte limit", self.records)
            if not reader._fill(8 + length):
                raise LogFormatError(reader._base + reader._pos, f"truncated record: "
                                     f"{reader._available() - 8} of {length} body bytes",
                                     self.records)

    def _fail(self, records: int, pos: int, reason: str) -> NoReturn:
        reader = self.reader
        raise LogFormatError(reader._base + pos, reason, self.records + records)

    def _framing(self, start: int) -> bool:
        """Decode and check the framing record at ``start`` (in the buffer); True at the end."""
        reader = self.reader
        reader.events_read = self.events
        reader.records_read = self.records
        body = reader._read_frame(self.limit, "record")
        item = decode_framing(body, start, reader.header.format_version)
        reader._check_framing(item, start)
        self.records += 1
        if isinstance(item, Checkpoint):
            self.checkpoints += 1
            return False
        assert isinstance(item, EndRecord)
        reader._after_end()
        return True

    def _result(self) -> Verified:
        reader = self.reader
        return Verified(reader.header.format_version, reader._base + reader._pos, self.records,
                        self.events, self.checkpoints, reader.digests, reader.digests_verified,
                        reader.digest_failure)
