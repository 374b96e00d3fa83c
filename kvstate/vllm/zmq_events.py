"""KV-event transport over ZeroMQ, wire-compatible with vLLM 0.33's publisher.

Publisher (:class:`ZmqEventPublisher`), configured like vLLM's ``KVEventsConfig``:

* each batch goes out on a PUB socket as three frames
  ``[topic, seq (8-byte big-endian, from 0), payload]``;
* the last ``buffer_steps`` payloads are kept for replay on an optional ROUTER
  socket.  A request is ``[identity, b"", start_seq (8 bytes)]`` (what a REQ
  client, or a DEALER sending ``[b"", start_seq]``, produces).  The reply is one
  message per buffered ``seq >= start_seq``, ``[topic, seq, payload]`` after the
  envelope (vLLM 0.33; ``replay_with_topic=False`` gives the older
  ``[seq, payload]``), then the end marker: ``seq`` = ``-1`` as 8 signed bytes
  with an empty payload.  A REQ client only ever sees the first reply
  message; DEALER clients see all of them.

Subscriber (:class:`KVEventSubscriber`): a SUB socket plus a DEALER for replay.
When a sequence number jumps it asks for the missing range, accepts both reply
shapes, drops duplicates, and records what could not be recovered.

Threads: the publisher owns one background thread, which alone touches its
sockets after construction; :meth:`ZmqEventPublisher.publish` only enqueues.
The subscriber is single-threaded and owns its sockets.  This module needs the
optional ``pyzmq`` package.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any

import attrs
import zmq

from kvstate.vllm.kv_events import (
    KVEventBatch,
    KVEventDecodeError,
    WireFormat,
    decode_event_batch,
    encode_event_batch,
)

__all__ = [
    "END_SEQ",
    "KVEventSubscriber",
    "KVEventsConfig",
    "SequencedBatch",
    "ZmqEventPublisher",
    "offset_endpoint_port",
]

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""Sequence frame of the replay end marker."""


def _resolve_publisher(config: KVEventsConfig, value: str | None) -> str:
    if value is None:
        return "zmq" if config.enable_kv_cache_events else "null"
    if value not in ("null", "zmq"):
        raise ValueError(f"publisher must be 'null' or 'zmq', not {value!r}")
    return value


@attrs.frozen
class KVEventsConfig:
    """The fields and defaults of vLLM's ``KVEventsConfig``.

    ``publisher`` left as ``None`` resolves to ``"zmq"`` when events are
    enabled and ``"null"`` otherwise, as in vLLM.
    """

    enable_kv_cache_events: bool = False
    publisher: str | None = attrs.field(default=None)
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "publisher", _resolve_publisher(self, self.publisher))
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


def offset_endpoint_port(endpoint: str | None, data_parallel_rank: int) -> str | None:
    """Per-DP-rank endpoint, as vLLM derives it: a TCP port is offset by the rank
    (port 0 stays 0), an inproc name gets ``_dp{rank}``; rank 0 is unchanged."""
    if not endpoint or data_parallel_rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{data_parallel_rank}"
    if "tcp" in endpoint:
        base, _, port = endpoint.rpartition(":")
        if not base or not port.isdigit():
            return endpoint
        return endpoint if int(port) == 0 else f"{base}:{int(port) + data_parallel_rank}"
    raise ValueError(f"endpoint must be inproc or tcp: {endpoint!r}")


def _is_bind_endpoint(endpoint: str) -> bool:
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def _bind_or_connect(socket: zmq.Socket[Any], endpoint: str, bind: bool | None) -> str:
    """Bind (returning the real endpoint, so port 0 reports the chosen port) or connect."""
    if bind if bind is not None else _is_bind_endpoint(endpoint):
        socket.bind(endpoint)
        bound = socket.getsockopt(zmq.LAST_ENDPOINT)
        return bound.decode() if isinstance(bound, bytes) and bound else endpoint
    socket.connect(endpoint)
    return endpoint


class ZmqEventPublisher:
    """PUB publisher with a bounded replay buffer, compatible with vLLM 0.33.

    Owns its sockets and a daemon thread; call :meth:`shutdown` to stop both.
    ``publish`` never mutates the batch it is given (the rank is stamped on a
    copy).  ``wire_format`` selects the payload form ("map" is vLLM 0.33's).
    """

    def __init__(
        self,
        data_parallel_rank: int = 0,
        endpoint: str = "tcp://*:5557",
        replay_endpoint: str | None = None,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        max_queue_size: int = 100_000,
        topic: str = "",
        *,
        wire_format: WireFormat = "map",
        replay_with_topic: bool = True,
        bind: bool | None = None,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        config = KVEventsConfig(
            True, "zmq", endpoint, replay_endpoint, buffer_steps, hwm, max_queue_size, topic
        )
        self.config = config
        self.data_parallel_rank = data_parallel_rank
        self.wire_format: WireFormat = wire_format
        self.replay_with_topic = replay_with_topic
        self._topic = topic.encode("utf-8")
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=max_queue_size)
        self._buffer: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=buffer_steps)
        self._next_seq = 0
        self._published = threading.Condition()
        self._published_count = 0
        self.rejected_replay_requests = 0
        self._context = context or zmq.Context.instance()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.set_hwm(hwm)
        pub_endpoint = offset_endpoint_port(endpoint, data_parallel_rank)
        assert pub_endpoint is not None
        self.endpoint = _bind_or_connect(self._pub, pub_endpoint, bind)
        self._replay: zmq.Socket[Any] | None = None
        self.replay_endpoint: str | None = None
        replay_at = offset_endpoint_port(replay_endpoint, data_parallel_rank)
        if replay_at is not None:
            self._replay = self._context.socket(zmq.ROUTER)
            # Room for a whole replay and its end marker, as vLLM sizes it.
            self._replay.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))
            self.replay_endpoint = _bind_or_connect(self._replay, replay_at, True)
        self._running = True
        self._thread = threading.Thread(target=self._run, name="kvstate-zmq-publisher", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(
        cls, config: KVEventsConfig, data_parallel_rank: int = 0, **options: Any
    ) -> ZmqEventPublisher:
        """Build a publisher from a config whose publisher resolves to ``"zmq"``."""
        if config.publisher != "zmq":
            raise ValueError(f"config selects the {config.publisher!r} publisher, not 'zmq'")
        return cls(
            data_parallel_rank,
            config.endpoint,
            config.replay_endpoint,
            config.buffer_steps,
            config.hwm,
            config.max_queue_size,
            config.topic,
            **options,
        )

    def publish(self, batch: KVEventBatch) -> None:
        """Encode a batch here (so a bad batch raises ``KVEventEncodeError`` to the
        caller) and queue it, blocking while the queue is full.  A batch without a
        rank is stamped with this publisher's ``data_parallel_rank``."""
        if not self._running:
            raise RuntimeError("publisher is shut down")
        if batch.data_parallel_rank is None:
            batch = attrs.evolve(batch, data_parallel_rank=self.data_parallel_rank)
        self._queue.put(encode_event_batch(batch, self.wire_format))

    def wait_published(self, count: int, timeout_s: float) -> bool:
        """Block until at least ``count`` batches have been sent; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._published:
            while self._published_count < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._published.wait(remaining)
        return True

    def shutdown(self, timeout_s: float = 1.0) -> None:
        """Send what is queued (up to ``timeout_s``), stop the thread, close the sockets."""
        if not self._running:
            return
        self._running = False
        self._queue.put(None)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self._pub.close(linger=0)
            if self._replay is not None:
                self._replay.close(linger=0)

    def _run(self) -> None:
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                payload = self._queue.get(timeout=0.01)
            except queue.Empty:
                continue
            if payload is None:
                return
            seq = self._next_seq
            self._next_seq += 1
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            self._buffer.append((seq, payload))
            with self._published:
                self._published_count += 1
                self._published.notify_all()

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
            self.rejected_replay_requests += 1
            return
        identity, _, start_frame = frames
        start_seq = int.from_bytes(start_frame, "big")
        for seq, payload in list(self._buffer):
            if seq >= start_seq:
                body = (self._topic,) if self.replay_with_topic else ()
                self._replay.send_multipart((identity, b"", *body, seq.to_bytes(8, "big"), payload))
        marker = (b"", END_SEQ, b"") if self.replay_with_topic else (END_SEQ, b"")
        self._replay.send_multipart((identity, b"", *marker))


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
            if len(frames) != 3 or len(frames[1]) != 8:
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
        self._replay.send_multipart((b"", start_seq.to_bytes(8, "big")))
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
