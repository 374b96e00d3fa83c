"""The running digest a reader checks against a format 2 or 3 log's checkpoints and end record.

``DigestTracker`` hashes the bytes a reader has read, a buffer span at a
time (the reader hands it each span before dropping it and at each framing
record), and compares the hash of every byte before a checkpoint or the end
record with the digest that record carries.  The first mismatch is kept as
a ``DigestBreak`` (the interval whose bytes were altered); reading goes on,
because the frames themselves are well formed.  Owned by one reader.
"""

from __future__ import annotations

import zlib
from typing import Any

import attrs

from kvstate.log.format import FRAME, LENGTH, MAGIC, PREAMBLE_SIZE, VERSION_FIELD, new_digest


@attrs.frozen
class DigestBreak:
    """The first interval of a log whose bytes do not match the digest that closes it.

    The bytes between the framing record that starts the interval
    (``start_offset``, after ``start_events`` events; the header for the
    first) and the one at ``offset`` (after ``events`` events) were altered.
    """

    start_events: int
    start_offset: int
    events: int
    offset: int
    what: str  # "checkpoint" or "end record"

    def describe(self) -> str:
        start = ("the header" if self.start_offset <= PREAMBLE_SIZE else
                 f"the checkpoint after event {self.start_events} (byte {self.start_offset})")
        return (f"the bytes between {start} and the {self.what} after event {self.events} "
                f"(byte {self.offset}) do not match its digest: they were altered")


class DigestTracker:
    """blake2b over a log's bytes from offset 0, fed in spans; checks each framing record."""

    def __init__(self, version: int, header_body: bytes) -> None:
        # The preamble and the header frame are covered too.  A reader with tiny chunks
        # may have dropped them from its buffer already; their bytes are known exactly
        # (the CRC matched), so they are hashed as rebuilt.
        length = LENGTH.pack(len(header_body))
        crc = zlib.crc32(header_body, zlib.crc32(length))
        self._hash: Any = new_digest()
        self._hash.update(MAGIC + VERSION_FIELD.pack(version) +
                          FRAME.pack(len(header_body), crc) + header_body)
        self.hashed = PREAMBLE_SIZE + FRAME.size + len(header_body)  # file offset hashed up to
        self._interval = (0, 0)  # (events, offset) of the framing record that opened it
        self.failure: DigestBreak | None = None
        self.verified = 0

    def feed(self, buf: bytes, base: int, upto: int) -> None:
        """Hash the file bytes ``[hashed, upto)``, which ``buf`` (starting at ``base``) holds."""
        if upto > self.hashed:
            self._hash.update(memoryview(buf)[self.hashed - base: upto - base])
            self.hashed = upto

    def check(self, digest: bytes | None, buf: bytes, base: int, start: int, events: int,
              what: str) -> None:
        """The framing record at ``start`` (in ``buf``) carries ``digest``: compare."""
        self.feed(buf, base, start)
        if digest == self._hash.digest():
            self.verified += 1
        elif self.failure is None:
            opened_events, opened_offset = self._interval
            self.failure = DigestBreak(opened_events, opened_offset, events, start, what)
        self._interval = (events, start)
