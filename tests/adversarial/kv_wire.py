"""A scripted publisher for subscriber tests: an XPUB socket plus an optional replay ROUTER.

``Wire`` binds an inproc XPUB socket, connects a ``KVEventSubscriber`` and waits
for its subscription to arrive (XPUB reports it), so no message is lost to the
slow-joiner race and every test can count exactly.  ``ReplayServer`` answers
replay requests from a script on a background thread.  Both own their sockets
(call ``close``); every wait is bounded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from kvstate.vllm.zmq_subscriber import KVEventSubscriber, SequencedBatch

WAIT_S = 5.0
Frames = list[bytes]


def seq_frame(value: int) -> bytes:
    return value.to_bytes(8, "big")


class ReplayServer:
    """A ROUTER answering each request ``[id, b"", start]`` with ``respond(start)``'s
    messages (each a frame list sent after the envelope)."""

    def __init__(self, context: Any, endpoint: str, respond: Callable[[int], list[Frames]]) -> None:
        self.router = context.socket(zmq.ROUTER)
        self.router.bind(endpoint)
        self.endpoint = self.router.getsockopt(zmq.LAST_ENDPOINT).decode()  # the port when ":0"
        self.respond = respond
        self.requests: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(20):
                continue
            identity, _, start = self.router.recv_multipart()
            self.requests.append(int.from_bytes(start, "big"))
            for frames in self.respond(int.from_bytes(start, "big")):
                self.router.send_multipart([identity, b"", *frames])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(WAIT_S)
        self.router.close(linger=0)


class Wire:
    """An XPUB socket at ``inproc://name`` with a connected, subscribed subscriber."""

    def __init__(self, context: Any, name: str, **subscriber_options: Any) -> None:
        self.pub = context.socket(zmq.XPUB)
        self.pub.bind(f"inproc://{name}")
        self.subscriber = KVEventSubscriber(f"inproc://{name}", context=context, **subscriber_options)
        assert self.pub.poll(int(WAIT_S * 1000)), "the subscription never arrived"
        self.pub.recv()  # b"\x01" + topic: the subscriber is now attached
        self.sent = 0

    def send_frames(self, frames: Frames) -> None:
        self.pub.send_multipart(frames)
        self.sent += 1

    def send(self, seq: int, payload: bytes, topic: bytes = b"") -> None:
        self.send_frames([topic, seq_frame(seq), payload])

    def pump(self) -> list[SequencedBatch]:
        """Receive until the subscriber has read every message sent so far."""
        got: list[SequencedBatch] = []
        deadline = time.monotonic() + WAIT_S
        while self.subscriber.stats.received < self.sent:
            assert time.monotonic() < deadline, f"read {self.subscriber.stats.received} of {self.sent}"
            got.extend(self.subscriber.receive(timeout_s=0.05))
        return got

    def pump_until_last(self, seq: int) -> list[SequencedBatch]:
        """Receive until the subscriber's position reaches ``seq`` (bounded wait)."""
        got: list[SequencedBatch] = []
        deadline = time.monotonic() + WAIT_S
        while self.subscriber.last_seq != seq:
            assert time.monotonic() < deadline, f"position {self.subscriber.last_seq}, wanted {seq}"
            got.extend(self.subscriber.receive(timeout_s=0.05))
        return got

    def pump_until_count(self, count: int) -> list[SequencedBatch]:
        """Receive until ``count`` batches were delivered (bounded wait)."""
        got: list[SequencedBatch] = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < count:
            assert time.monotonic() < deadline, f"delivered {[item.seq for item in got]}, wanted {count}"
            got.extend(self.subscriber.receive(timeout_s=0.05))
        return got

    def close(self) -> None:
        self.subscriber.close()
        self.pub.close(linger=0)
