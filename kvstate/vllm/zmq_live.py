"""The live side of the KV-event subscriber: a SUB socket that outlives a dropped connection.

The SUB socket caps frames at ``max_payload_bytes`` (``ZMQ_MAXMSGSIZE``), so
over tcp/ipc libzmq refuses a larger frame before buffering it whole.  libzmq
treats such a frame as a protocol error and ends that connection for good
(no reconnect), so a socket monitor watches for ``DISCONNECTED``; then the
complete messages still queued are read, and the socket is replaced by a new
one connected to the same endpoint.  The socket is replaced rather than
``disconnect()``-ed: tearing the pipe down from this side while a message is
queued can race a multipart read inside libzmq (``Assertion failed: !_more
(src/fq.cpp)``, which aborts the process); a teardown from the peer's side
keeps queued messages readable.  Batches lost while reconnecting show up as
a sequence gap, which the subscriber fills by replay.

:class:`LiveSocket` owns its SUB and monitor sockets and is single-threaded;
call :meth:`LiveSocket.close`.
"""

from __future__ import annotations

import time
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from kvstate.vllm.zmq_stats import SubscriberLimits

__all__ = ["LiveSocket"]


class LiveSocket:
    """One subscription to ``endpoint`` / ``topic``; ``reconnects`` counts re-made sockets."""

    def __init__(self, context: zmq.Context[Any], endpoint: str, topic: str,
                 limits: SubscriberLimits) -> None:
        self._context = context
        self._endpoint = endpoint
        self._topic = topic.encode("utf-8")
        self._limits = limits
        self.reconnects = 0
        self._open()

    def _open(self) -> None:
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.MAXMSGSIZE, self._limits.max_payload_bytes)
        sub.setsockopt(zmq.RCVHWM, self._limits.rcvhwm)
        sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        self._monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        sub.connect(self._endpoint)
        self._sub = sub
        self._poller = zmq.Poller()
        self._poller.register(sub, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)

    def close(self) -> None:
        """Close the sockets (idempotent)."""
        if not self._sub.closed:
            self._sub.disable_monitor()
        self._monitor.close(linger=0)
        self._sub.close(linger=0)

    def receive(self, timeout_s: float) -> list[list[bytes]]:
        """Wait up to ``timeout_s`` for a live message; the messages read (one, or
        after a dropped connection those still queued, at most ``rcvhwm``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining_ms = max(int((deadline - time.monotonic()) * 1000), 0)
            ready = dict(self._poller.poll(remaining_ms))
            if self._monitor in ready and self._dropped():
                return self._replace()
            if self._sub in ready:
                return [self._sub.recv_multipart()]
            if time.monotonic() >= deadline:
                return []

    def _dropped(self) -> bool:
        dropped = False
        while self._monitor.poll(0):
            event = parse_monitor_message(self._monitor.recv_multipart())
            dropped = dropped or event["event"] == zmq.EVENT_DISCONNECTED
        return dropped

    def _replace(self) -> list[list[bytes]]:
        """Read what is still queued, then re-make the socket (see the module docstring)."""
        queued: list[list[bytes]] = []
        while len(queued) < self._limits.rcvhwm and self._sub.poll(0):
            queued.append(self._sub.recv_multipart())
        self.close()
        self._open()
        self.reconnects += 1
        return queued
