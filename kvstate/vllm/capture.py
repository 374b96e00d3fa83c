"""Read captured KV-event streams in bounded memory, failing at an exact byte.

A capture is a file of concatenated msgpack items, each a ``KVEventBatch``
(map or array form, vLLM 0.33 or SGLang) or a frame list ``[seq, payload]`` /
``[topic, seq, payload]`` as a subscriber saves them.  :class:`CaptureReader`
pulls the file in ``READ_CHUNK_BYTES`` chunks and never holds more than one
item (at most ``max_item_bytes``, default ``MAX_CAPTURE_ITEM_BYTES``) besides
the batch it yields, so a capture of any size reads in flat memory.

Every malformed input -- bad msgpack, an item that is not a batch, an item
over the limit, a capture that ends inside an item -- raises
:class:`CaptureError` with the byte offset where the bad item starts; the
batches before it have been yielded.  The reader owns its file when given a
path (close it, or use ``with``); it is an iterator, read once.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from typing import IO, Any

import msgpack

from kvstate.vllm.kv_events import (
    KVEventBatch,
    KVEventDecodeError,
    batch_from_wire,
    decode_event_batch,
)

__all__ = ["MAX_CAPTURE_ITEM_BYTES", "READ_CHUNK_BYTES", "CaptureError", "CaptureReader", "read_capture"]

MAX_CAPTURE_ITEM_BYTES = 16 * 1024 * 1024
"""Largest item (one batch or frame list) a capture may hold by default: four
times the subscriber's default payload limit.  Decoding an item may allocate
up to ~80 times its size (see ``docs/vllm.md``), hence a modest default."""
READ_CHUNK_BYTES = 1 << 20


class CaptureError(KVEventDecodeError):
    """A capture is malformed at byte ``offset`` (None when the batches did not
    come from a file) in batch ``batch_index`` (the number of complete batches
    before it), for ``reason``."""

    def __init__(self, offset: int | None, reason: str, batch_index: int | None = None) -> None:
        self.offset = offset
        self.reason = reason
        self.batch_index = batch_index
        where = [f"byte {offset}"] if offset is not None else []
        where += [f"batch {batch_index}"] if batch_index is not None else []
        super().__init__(f"malformed capture at {', '.join(where) or 'an unknown place'}: {reason}")


class _CountingFile:
    """Counts the bytes handed to the unpacker, to tell a clean end from a cut-off item."""

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file
        self.total = 0

    def read(self, size: int = -1) -> bytes:
        data = self._file.read(size)
        self.total += len(data)
        return data


class CaptureReader:
    """Iterator over a capture's batches; ``offset`` / ``end`` locate the item
    last yielded and ``index`` counts the batches yielded so far."""

    def __init__(self, source: str | os.PathLike[str] | IO[bytes], *,
                 max_item_bytes: int = MAX_CAPTURE_ITEM_BYTES) -> None:
        if isinstance(source, (str, os.PathLike)):
            self._file: IO[bytes] = open(source, "rb")  # noqa: SIM115 - owned, closed in close()
            self._owns = True
        else:
            self._file = source
            self._owns = False
        self._counting = _CountingFile(self._file)
        self._unpacker = msgpack.Unpacker(
            self._counting, read_size=min(READ_CHUNK_BYTES, max_item_bytes),
            max_buffer_size=max_item_bytes, raw=False, use_list=False, strict_map_key=True,
            max_ext_len=0)
        self.max_item_bytes = max_item_bytes
        self.offset = 0
        self.end = 0
        self.index = 0

    def close(self) -> None:
        """Close the file if the reader opened it (idempotent)."""
        if self._owns:
            self._file.close()

    def __enter__(self) -> CaptureReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[KVEventBatch]:
        return self

    def __next__(self) -> KVEventBatch:
        try:
            return self._next()
        except BaseException:
            self.close()  # exhausted or failed: an owned file is not needed any more
            raise

    def _next(self) -> KVEventBatch:
        start = self._unpacker.tell()
        try:
            item = self._unpacker.unpack()
        except msgpack.OutOfData:
            if self._counting.total > start:
                raise self._error(start, f"the capture ends inside an item "
                                  f"({self._counting.total - start} bytes cut off)") from None
            raise StopIteration from None
        except msgpack.BufferFull:
            raise self._error(start, f"an item is larger than {self.max_item_bytes} bytes") from None
        except Exception as exc:  # msgpack raises several unrelated types for bad bytes
            raise self._error(start, f"not a msgpack stream: {str(exc) or type(exc).__name__}") from None
        try:
            batch = _batch_of(item)
        except KVEventDecodeError as exc:
            raise self._error(start, str(exc)) from None
        self.offset, self.end = start, self._unpacker.tell()
        self.index += 1
        return batch

    def _error(self, offset: int, reason: str) -> CaptureError:
        return CaptureError(offset, reason, self.index)


def _batch_of(item: Any) -> KVEventBatch:
    if isinstance(item, tuple) and len(item) in (2, 3) and isinstance(item[-1], bytes):
        return decode_event_batch(item[-1])  # a frame list: the payload is the last frame
    if isinstance(item, tuple):
        return batch_from_wire(item)
    raise KVEventDecodeError(f"an item is a {type(item).__name__}, not a batch or a frame list")


def read_capture(data: bytes) -> list[KVEventBatch]:
    """Every batch of an in-memory capture.  Raises :class:`CaptureError`."""
    return list(CaptureReader(io.BytesIO(data)))
