"""Client of a KV-event publisher's replay ROUTER socket, bounded per request.

What vLLM 0.33's replay socket accepts and returns (frames: ``zmq_framing``):
a request is ``[b"", start_seq]`` from a DEALER (the ROUTER prepends the
identity); a malformed request gets no answer at all.  The reply is one
message per *buffered* batch with ``seq >= start_seq`` (the last
``buffer_steps`` batches only), ``[topic, seq, payload]`` or the older
``[seq, payload]``, then the end marker.  The ROUTER drops at its high-water
mark, so a reply can also stop short without its end marker.

:class:`ReplayClient` sends one request at a time, keeps only the replies in
the range asked for, stops reading at ``max_replay_batches`` messages or
``max_replay_bytes`` of kept payload (or the timeout), and then closes its
socket so a late remainder cannot be mistaken for the next reply.  It owns its
DEALER socket and is single-threaded; :class:`ReplayResult` is frozen.
"""

from __future__ import annotations

import time
from typing import Any

import attrs
import zmq

from kvstate.vllm.zmq_framing import END_SEQ, SEQ_BYTES
from kvstate.vllm.zmq_stats import DropLedger, DropReason, SubscriberLimits

__all__ = ["ReplayClient", "ReplayResult"]

_SEQ_LIMIT = 1 << (8 * SEQ_BYTES)


@attrs.frozen
class ReplayResult:
    """Replayed ``(seq, payload)`` pairs in the range asked for, ascending and
    unique; ``complete`` when the end marker arrived within the bounds;
    ``overlap`` the reply messages outside the range (ignored)."""

    pairs: tuple[tuple[int, bytes], ...]
    complete: bool
    overlap: int


class ReplayClient:
    """DEALER client of one replay endpoint; call :meth:`close` when done."""

    def __init__(self, context: zmq.Context[Any], endpoint: str, timeout_s: float,
                 limits: SubscriberLimits, ledger: DropLedger) -> None:
        self._context = context
        self._endpoint = endpoint
        self._timeout_s = timeout_s
        self._limits = limits
        self._ledger = ledger
        self._socket: zmq.Socket[Any] | None = None
        self.requests = 0
        self.cut_short = 0

    def close(self) -> None:
        """Close the socket (idempotent); a later request opens a new one."""
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None

    def _open(self) -> zmq.Socket[Any]:
        if self._socket is not None and self._socket.poll(0):
            # Something arrived that no request asked for: start from a clean socket.
            self._ledger.drop(DropReason.REPLAY_MALFORMED, None, b"", "unsolicited replay message")
            self.close()
        if self._socket is None:
            self._socket = self._context.socket(zmq.DEALER)
            self._socket.setsockopt(zmq.MAXMSGSIZE, self._limits.max_payload_bytes)
            self._socket.connect(self._endpoint)
        return self._socket

    def fetch(self, start_seq: int, stop_seq: int | None = None) -> ReplayResult:
        """Ask for every buffered batch from ``start_seq``; keep those below
        ``stop_seq`` (exclusive, None = no upper end).  Never raises for what
        the replay socket sends; raises ``ValueError`` for a start that has no
        8-byte encoding."""
        if not 0 <= start_seq < _SEQ_LIMIT:
            raise ValueError(f"start_seq must be in 0..2**64-1, got {start_seq}")
        socket = self._open()
        self.requests += 1
        socket.send_multipart((b"", start_seq.to_bytes(SEQ_BYTES, "big")))
        kept: dict[int, bytes] = {}
        overlap = messages = kept_bytes = 0
        deadline = time.monotonic() + self._timeout_s
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not socket.poll(remaining_ms):
                return self._abandon(kept, overlap)
            frames = socket.recv_multipart()
            messages += 1
            if messages > self._limits.max_replay_batches:
                return self._abandon(kept, overlap)
            if frames and frames[0] == b"":
                frames = frames[1:]
            if len(frames) not in (2, 3) or len(frames[-2]) != SEQ_BYTES:
                self._ledger.drop(DropReason.REPLAY_MALFORMED, None, frames[-1] if frames else b"",
                                  f"{len(frames)} frames")
                continue
            seq_frame, payload = frames[-2], frames[-1]
            if seq_frame == END_SEQ:
                return ReplayResult(tuple(sorted(kept.items())), True, overlap)
            seq = int.from_bytes(seq_frame, "big")
            if seq < start_seq or (stop_seq is not None and seq >= stop_seq) or seq in kept:
                overlap += 1
                continue
            kept_bytes += len(payload)
            if kept_bytes > self._limits.max_replay_bytes:
                return self._abandon(kept, overlap)
            kept[seq] = payload

    def _abandon(self, kept: dict[int, bytes], overlap: int) -> ReplayResult:
        self.cut_short += 1
        self.close()  # the rest of this reply must not leak into the next one
        return ReplayResult(tuple(sorted(kept.items())), False, overlap)
