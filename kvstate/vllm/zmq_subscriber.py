"""KV-event subscriber over ZeroMQ that fills sequence gaps by replay (frames: ``zmq_framing``).

:class:`KVEventSubscriber` reads a publisher's PUB socket and, through a
DEALER socket, its replay ROUTER.  When a sequence number jumps it asks for
the missing range, accepts both reply shapes (``[topic, seq, payload]`` and
the older ``[seq, payload]``), drops duplicates, and records what could not be
recovered.

Ownership: the subscriber is single-threaded and owns its sockets (call
:meth:`KVEventSubscriber.close`); ``receive`` and ``request_replay`` mutate
its counters and ``last_seq``.  :class:`SequencedBatch` is frozen.  Needs the
optional ``pyzmq`` package.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import attrs
import zmq

from kvstate.vllm.kv_events import KVEventBatch, KVEventDecodeError, decode_event_batch
from kvstate.vllm.zmq_framing import END_SEQ, SEQ_BYTES

__all__ = ["KVEventSubscriber", "SequencedBatch"]


@attrs.frozen
class SequencedBatch:
    """A decoded batch with the publisher's sequence number."""

    seq: int
    batch: KVEventBatch


class KVEventSubscriber:
    """SUB client that fills sequence gaps from a publisher's replay socket.

    ``start_seq`` (optional) makes the first batch received also trigger a
    replay from that sequence number, to catch up on what was published before
    the subscription took effect.  Owns its sockets; call :meth:`close`.
    """

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        *,
        start_seq: int | None = None,
        replay_timeout_s: float = 2.0,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        self._context = context or zmq.Context.instance()
        self._sub = self._context.socket(zmq.SUB)
        self._sub.connect(endpoint)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
        self._replay_endpoint = replay_endpoint
        self._replay: zmq.Socket[Any] | None = None
        self._replay_timeout_s = replay_timeout_s
        self._start_seq = start_seq
        self.last_seq: int | None = None
        self.missed: list[tuple[int, int]] = []
        """Inclusive ranges of sequence numbers that replay could not supply."""
        self.replay_requests = 0
        self.undecodable: list[tuple[int, bytes, KVEventDecodeError]] = []
        """``(seq, payload, error)`` for payloads that did not decode; kept, not raised."""
        self.malformed_messages = 0
        """Live messages that were not ``[topic, 8-byte seq, payload]``; dropped."""
        self._ready: collections.deque[SequencedBatch] = collections.deque()

    def close(self) -> None:
        """Close both sockets (idempotent)."""
        self._sub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def receive(self, timeout_s: float) -> list[SequencedBatch]:
        """Wait up to ``timeout_s`` for the next live message; return every batch
        now in order (replayed ones first).  Returns ``[]`` on timeout.

        A payload that does not decode still advances ``last_seq`` and is
        recorded in :attr:`undecodable`.
        """
        if self._sub.poll(int(timeout_s * 1000)):
            frames = self._sub.recv_multipart()
            if len(frames) != 3 or len(frames[1]) != SEQ_BYTES:
                self.malformed_messages += 1
                return []
            seq = int.from_bytes(frames[1], "big")
            expected = self.last_seq + 1 if self.last_seq is not None else self._start_seq
            if expected is not None and seq > expected:
                self._fill_gap(expected, seq)
            self._accept(seq, frames[2])
        ready = list(self._ready)
        self._ready.clear()
        return ready

    def request_replay(self, start_seq: int) -> list[tuple[int, bytes]]:
        """Ask the replay socket for every buffered batch from ``start_seq``;
        returns raw ``(seq, payload)`` pairs.  Accepts both reply shapes."""
        if self._replay_endpoint is None:
            return []
        if self._replay is None:
            self._replay = self._context.socket(zmq.DEALER)
            self._replay.connect(self._replay_endpoint)
        self.replay_requests += 1
        self._replay.send_multipart((b"", start_seq.to_bytes(SEQ_BYTES, "big")))
        replies: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + self._replay_timeout_s
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not self._replay.poll(remaining_ms):
                # No end marker: drop this socket so late replies cannot leak into the next.
                self._replay.close(linger=0)
                self._replay = None
                return replies
            frames = self._replay.recv_multipart()
            if frames and frames[0] == b"":
                frames = frames[1:]
            if len(frames) == 3:
                seq_frame, payload = frames[1], frames[2]
            elif len(frames) == 2:
                seq_frame, payload = frames[0], frames[1]
            else:
                continue
            if seq_frame == END_SEQ:
                return replies
            replies.append((int.from_bytes(seq_frame, "big"), payload))

    def _fill_gap(self, first_missing: int, live_seq: int) -> None:
        recovered = {
            seq: payload
            for seq, payload in self.request_replay(first_missing)
            if first_missing <= seq < live_seq
        }
        next_expected = first_missing
        for seq in sorted(recovered):
            if seq > next_expected:
                self.missed.append((next_expected, seq - 1))
            self._accept(seq, recovered[seq])
            next_expected = seq + 1
        if next_expected < live_seq:
            self.missed.append((next_expected, live_seq - 1))

    def _accept(self, seq: int, payload: bytes) -> None:
        if self.last_seq is not None and seq <= self.last_seq:
            return  # already delivered (a duplicate from replay)
        self.last_seq = seq
        try:
            self._ready.append(SequencedBatch(seq, decode_event_batch(payload)))
        except KVEventDecodeError as error:
            self.undecodable.append((seq, payload, error))
