"""KV-event publisher over ZeroMQ, wire-compatible with vLLM 0.33's (frames: ``zmq_framing``).

:class:`ZmqEventPublisher`, configured like vLLM's ``KVEventsConfig``
(:class:`KVEventsConfig`, with :func:`offset_endpoint_port` for per-DP-rank
endpoints):

* each batch goes out on a PUB socket as ``[topic, seq, payload]``, ``seq``
  counting from 0;
* the last ``buffer_steps`` payloads are kept for replay on an optional ROUTER
  socket.  A request is ``[identity, b"", start_seq]`` (what a REQ client, or a
  DEALER sending ``[b"", start_seq]``, produces).  The reply is one message per
  buffered ``seq >= start_seq``, ``[topic, seq, payload]`` after the envelope
  (vLLM 0.33; ``replay_with_topic=False`` gives the older ``[seq, payload]``),
  then the end marker ``END_SEQ`` with an empty payload.  A REQ client only
  ever sees the first reply message; DEALER clients see all of them.

Ownership: the publisher owns its sockets, its queue, its replay buffer and
one background thread, which alone touches the sockets after construction;
:meth:`ZmqEventPublisher.publish` only enqueues and never mutates the batch it
is given.  ``KVEventsConfig`` is frozen.  Needs the optional ``pyzmq`` package.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any

import attrs
import zmq

from kvstate.vllm.kv_events import KVEventBatch, WireFormat, encode_event_batch
from kvstate.vllm.zmq_framing import END_SEQ, SEQ_BYTES

__all__ = ["KVEventsConfig", "ZmqEventPublisher", "offset_endpoint_port"]


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
            self._pub.send_multipart((self._topic, seq.to_bytes(SEQ_BYTES, "big"), payload))
            self._buffer.append((seq, payload))
            with self._published:
                self._published_count += 1
                self._published.notify_all()

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != SEQ_BYTES:
            self.rejected_replay_requests += 1
            return
        identity, _, start_frame = frames
        start_seq = int.from_bytes(start_frame, "big")
        for seq, payload in list(self._buffer):
            if seq >= start_seq:
                body = (self._topic,) if self.replay_with_topic else ()
                self._replay.send_multipart((identity, b"", *body, seq.to_bytes(SEQ_BYTES, "big"), payload))
        marker = (b"", END_SEQ, b"") if self.replay_with_topic else (END_SEQ, b"")
        self._replay.send_multipart((identity, b"", *marker))
