"""ZMQ publisher / subscriber for KV events, over inproc and loopback only.

Every wait is bounded (a few seconds at most); nothing asserts on timing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

zmq = pytest.importorskip("zmq")

from kvstate.vllm.kv_events import (  # noqa: E402
    AllBlocksCleared,
    BlockRemoved,
    KVEventBatch,
    KVEventEncodeError,
    decode_event_batch,
    encode_event_batch,
)
from kvstate.vllm.zmq_events import (  # noqa: E402
    END_SEQ,
    DropReason,
    KVEventsConfig,
    KVEventSubscriber,
    SequencedBatch,
    ZmqEventPublisher,
    offset_endpoint_port,
)

WAIT_S = 5.0


@pytest.fixture
def context() -> Iterator[Any]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def _batch(index: int) -> KVEventBatch:
    return KVEventBatch(ts=float(index), events=[BlockRemoved([index], "GPU")])


def _seq(value: int) -> bytes:
    return value.to_bytes(8, "big")


def _recv(socket: Any) -> list[bytes]:
    assert socket.poll(int(WAIT_S * 1000)), "no message within the bound"
    return socket.recv_multipart()  # type: ignore[no-any-return]


def _receive_until(
    subscriber: KVEventSubscriber, done: Callable[[list[SequencedBatch]], bool], feed: Callable[[], None]
) -> list[SequencedBatch]:
    """Feed the publisher and collect until ``done`` holds (slow-joiner safe)."""
    received: list[SequencedBatch] = []
    deadline = time.monotonic() + WAIT_S
    while not done(received):
        assert time.monotonic() < deadline, f"gave up after {len(received)} batches"
        feed()
        received.extend(subscriber.receive(timeout_s=0.05))
    return received


# ------------------------------------------------------------------ config


def test_config_defaults_match_vllm() -> None:
    config = KVEventsConfig()
    assert (config.enable_kv_cache_events, config.publisher, config.endpoint) == (
        False,
        "null",
        "tcp://*:5557",
    )
    assert (config.replay_endpoint, config.buffer_steps, config.hwm) == (None, 10_000, 100_000)
    assert (config.max_queue_size, config.topic) == (100_000, "")
    assert KVEventsConfig(enable_kv_cache_events=True).publisher == "zmq"
    assert KVEventsConfig(enable_kv_cache_events=True, publisher="null").publisher == "null"


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="publisher"):
        KVEventsConfig(publisher="kafka")
    with pytest.raises(ValueError, match="buffer_steps"):
        KVEventsConfig(buffer_steps=0)
    with pytest.raises(ValueError, match="'null'"):
        ZmqEventPublisher.from_config(KVEventsConfig())


def test_offset_endpoint_port_per_dp_rank() -> None:
    assert offset_endpoint_port("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint_port("tcp://*:5557", 3) == "tcp://*:5560"
    assert offset_endpoint_port("tcp://*:0", 3) == "tcp://*:0"
    assert offset_endpoint_port("inproc://events", 2) == "inproc://events_dp2"
    assert offset_endpoint_port(None, 2) is None
    with pytest.raises(ValueError, match="inproc or tcp"):
        offset_endpoint_port("ipc:///x", 1)


# ------------------------------------------------------------------ publisher wire


def test_pub_frames_are_topic_seq_payload(context: Any) -> None:
    publisher = ZmqEventPublisher(
        data_parallel_rank=2, endpoint="inproc://pub-frames", topic="kv", context=context
    )
    assert publisher.endpoint == "inproc://pub-frames_dp2"  # offset by the DP rank
    sub = context.socket(zmq.SUB)
    sub.connect(publisher.endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    try:
        deadline = time.monotonic() + WAIT_S
        published = 0
        while not sub.poll(20):
            assert time.monotonic() < deadline
            publisher.publish(_batch(published))
            published += 1
        topic, seq_frame, payload = sub.recv_multipart()
        assert topic == b"kv" and len(seq_frame) == 8
        first_seq = int.from_bytes(seq_frame, "big")
        assert 0 <= first_seq < published
        # The rank is stamped on batches that have none; payload is vLLM's map form.
        assert decode_event_batch(payload) == KVEventBatch(
            float(first_seq), [BlockRemoved([first_seq], "GPU")], 2
        )
        assert payload == encode_event_batch(
            KVEventBatch(float(first_seq), [BlockRemoved([first_seq], "GPU")], 2)
        )
        explicit = KVEventBatch(ts=9.0, events=[AllBlocksCleared()], data_parallel_rank=7)
        publisher.publish(explicit)
        frames = []
        while True:
            frames = _recv(sub)
            if decode_event_batch(frames[2]) == explicit:
                break
        assert frames[1] == _seq(published)  # consecutive numbering from 0
    finally:
        sub.close(linger=0)
        publisher.shutdown()


def test_replay_to_dealer_sends_three_frames_and_end_marker(context: Any) -> None:
    publisher = ZmqEventPublisher(
        endpoint="inproc://p1", replay_endpoint="inproc://r1", topic="t", context=context
    )
    dealer = context.socket(zmq.DEALER)
    dealer.connect("inproc://r1")
    try:
        for index in range(5):
            publisher.publish(_batch(index))
        assert publisher.wait_published(5, WAIT_S)
        dealer.send_multipart([b"", _seq(2)])
        for seq in (2, 3, 4):
            assert _recv(dealer) == [
                b"",
                b"t",
                _seq(seq),
                encode_event_batch(KVEventBatch(seq, [BlockRemoved([seq], "GPU")], 0)),
            ]
        assert _recv(dealer) == [b"", b"", END_SEQ, b""]
        assert END_SEQ == b"\xff" * 8
    finally:
        dealer.close(linger=0)
        publisher.shutdown()


def test_replay_to_req_client_gets_first_message_in_three_frames(context: Any) -> None:
    publisher = ZmqEventPublisher(endpoint="inproc://p2", replay_endpoint="inproc://r2", context=context)
    req = context.socket(zmq.REQ)
    req.connect("inproc://r2")
    try:
        for index in range(3):
            publisher.publish(_batch(index))
        assert publisher.wait_published(3, WAIT_S)
        req.send(_seq(1))
        topic, seq_frame, payload = _recv(req)
        assert (topic, seq_frame) == (b"", _seq(1))
        assert decode_event_batch(payload) == KVEventBatch(1.0, [BlockRemoved([1], "GPU")], 0)
    finally:
        req.close(linger=0)
        publisher.shutdown()


def test_replay_buffer_is_bounded_and_legacy_shape(context: Any) -> None:
    publisher = ZmqEventPublisher(
        endpoint="inproc://p3",
        replay_endpoint="inproc://r3",
        buffer_steps=3,
        replay_with_topic=False,
        context=context,
    )
    dealer = context.socket(zmq.DEALER)
    dealer.connect("inproc://r3")
    try:
        for index in range(6):
            publisher.publish(_batch(index))
        assert publisher.wait_published(6, WAIT_S)
        dealer.send_multipart([b"", _seq(0)])
        replies = [_recv(dealer) for _ in range(4)]
        assert [frames[1] for frames in replies[:3]] == [_seq(3), _seq(4), _seq(5)]
        assert all(len(frames) == 3 for frames in replies[:3])
        assert replies[3] == [b"", END_SEQ, b""]
    finally:
        dealer.close(linger=0)
        publisher.shutdown()


def test_malformed_replay_request_is_counted_and_ignored(context: Any) -> None:
    publisher = ZmqEventPublisher(endpoint="inproc://p4", replay_endpoint="inproc://r4", context=context)
    dealer = context.socket(zmq.DEALER)
    dealer.connect("inproc://r4")
    try:
        publisher.publish(_batch(0))
        assert publisher.wait_published(1, WAIT_S)
        dealer.send_multipart([b"", b"short"])
        dealer.send_multipart([b"x", _seq(0)])
        dealer.send_multipart([b"", _seq(0)])
        assert _recv(dealer)[2] == _seq(0)
        assert _recv(dealer) == [b"", b"", END_SEQ, b""]
        assert publisher.rejected_replay_requests == 2
    finally:
        dealer.close(linger=0)
        publisher.shutdown()


def test_publish_errors(context: Any) -> None:
    publisher = ZmqEventPublisher(endpoint="inproc://p5", context=context)
    with pytest.raises(KVEventEncodeError):
        publisher.publish(KVEventBatch(0.0, [BlockRemoved([2**64], "GPU")]))
    publisher.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        publisher.publish(_batch(0))


# ------------------------------------------------------------------ subscriber


def test_subscriber_catches_up_from_start_seq_via_replay(context: Any) -> None:
    publisher = ZmqEventPublisher(endpoint="inproc://p6", replay_endpoint="inproc://r6", context=context)
    for index in range(3):
        publisher.publish(_batch(index))
    assert publisher.wait_published(3, WAIT_S)  # published before anyone subscribed
    subscriber = KVEventSubscriber("inproc://p6", "inproc://r6", start_seq=0, context=context)
    counter = iter(range(3, 10_000))
    try:
        received = _receive_until(
            subscriber, lambda got: len(got) >= 5, lambda: publisher.publish(_batch(next(counter)))
        )
        seqs = [item.seq for item in received]
        assert seqs == list(range(len(seqs)))
        assert [item.batch.events[0] for item in received] == [BlockRemoved([s], "GPU") for s in seqs]
        assert subscriber.replay_requests >= 1 and subscriber.missed == []
    finally:
        subscriber.close()
        publisher.shutdown()


class _FakeEngine:
    """A raw PUB + ROUTER pair playing an engine whose stream has a gap."""

    def __init__(self, context: Any, name: str, replay_frames: list[list[bytes]]) -> None:
        self.pub = context.socket(zmq.PUB)
        self.pub.bind(f"inproc://{name}-pub")
        self.router = context.socket(zmq.ROUTER)
        self.router.bind(f"inproc://{name}-replay")
        self.replay_frames = replay_frames
        self.requests: list[list[bytes]] = []
        self.thread = threading.Thread(target=self._serve_one, daemon=True)
        self.thread.start()

    def _serve_one(self) -> None:
        if not self.router.poll(int(WAIT_S * 1000)):
            return
        request = self.router.recv_multipart()
        self.requests.append(request)
        for frames in self.replay_frames:
            self.router.send_multipart([request[0], b"", *frames])

    def send(self, seq: int) -> None:
        self.pub.send_multipart([b"", _seq(seq), encode_event_batch(_batch(seq), "array")])

    def close(self) -> None:
        self.thread.join(WAIT_S)
        self.pub.close(linger=0)
        self.router.close(linger=0)


def _payload(seq: int) -> bytes:
    return encode_event_batch(_batch(seq))


@pytest.mark.parametrize(
    "replay_frames",
    [
        [[b"", _seq(1), _payload(1)], [b"", _seq(2), _payload(2)], [b"", END_SEQ, b""]],
        [[_seq(1), _payload(1)], [_seq(2), _payload(2)], [END_SEQ, b""]],
        # Replay may include what the subscriber already has; duplicates are dropped.
        [
            [_seq(0), _payload(0)],
            [_seq(1), _payload(1)],
            [_seq(2), _payload(2)],
            [_seq(3), _payload(3)],
            [END_SEQ, b""],
        ],
    ],
    ids=["three-frame", "two-frame", "overlapping"],
)
def test_subscriber_fills_gap_with_either_reply_shape(context: Any, replay_frames: list[list[bytes]]) -> None:
    engine = _FakeEngine(context, "gap", replay_frames)
    subscriber = KVEventSubscriber("inproc://gap-pub", "inproc://gap-replay", context=context)
    try:
        first = _receive_until(subscriber, lambda got: len(got) >= 1, lambda: engine.send(0))
        assert [item.seq for item in first] == [0]
        engine.send(3)  # seq 1 and 2 were lost
        rest = subscriber.receive(timeout_s=WAIT_S)
        assert [item.seq for item in rest] == [1, 2, 3]
        assert [item.batch for item in rest] == [_batch(1), _batch(2), _batch(3)]
        assert engine.requests[0][1:] == [b"", _seq(1)]
        assert subscriber.missed == [] and subscriber.last_seq == 3
    finally:
        subscriber.close()
        engine.close()


def test_subscriber_records_what_replay_cannot_supply(context: Any) -> None:
    engine = _FakeEngine(context, "lost", [[b"", _seq(2), _payload(2)], [b"", END_SEQ, b""]])
    subscriber = KVEventSubscriber("inproc://lost-pub", "inproc://lost-replay", context=context)
    try:
        _receive_until(subscriber, lambda got: len(got) >= 1, lambda: engine.send(0))
        engine.send(4)
        rest = subscriber.receive(timeout_s=WAIT_S)
        assert [item.seq for item in rest] == [2, 4]
        assert subscriber.missed == [(1, 1), (3, 3)]
    finally:
        subscriber.close()
        engine.close()


def test_subscriber_without_replay_records_gap_and_bad_payloads(context: Any) -> None:
    pub = context.socket(zmq.PUB)
    pub.bind("inproc://noreplay")
    subscriber = KVEventSubscriber("inproc://noreplay", context=context)
    try:
        _receive_until(
            subscriber,
            lambda got: len(got) >= 1,
            lambda: pub.send_multipart([b"", _seq(0), _payload(0)]),
        )
        pub.send_multipart([b"", _seq(5), b"\xc1not msgpack"])
        pub.send_multipart([b"", b"bad-seq", _payload(6)])
        pub.send_multipart([b"", _seq(6), _payload(6)])
        got: list[SequencedBatch] = []
        deadline = time.monotonic() + WAIT_S
        while subscriber.last_seq != 6:
            assert time.monotonic() < deadline
            got.extend(subscriber.receive(timeout_s=0.1))
        assert [item.seq for item in got] == [6]
        assert subscriber.missed == [(1, 4)]
        stats = subscriber.stats
        assert stats.dropped[DropReason.UNDECODABLE] == 1
        assert stats.dropped[DropReason.MALFORMED_FRAMES] == 1
        assert stats.missed_batches == 4 and stats.delivered == 2
        undecodable = [s for s in subscriber.dropped_samples if s.reason == DropReason.UNDECODABLE]
        assert [(s.seq, s.head, s.size) for s in undecodable] == [(5, b"\xc1not msgpack", 12)]
        assert "not valid msgpack" in undecodable[0].detail
        assert subscriber.replay_requests == 0
    finally:
        subscriber.close()
        pub.close(linger=0)


def test_end_to_end_over_loopback_tcp(context: Any) -> None:
    publisher = ZmqEventPublisher(
        endpoint="tcp://127.0.0.1:0",
        replay_endpoint="tcp://127.0.0.1:0",
        bind=True,
        topic="kv-events",
        context=context,
    )
    assert publisher.endpoint.startswith("tcp://127.0.0.1:") and not publisher.endpoint.endswith(":0")
    assert publisher.replay_endpoint is not None
    publisher.publish(_batch(0))
    assert publisher.wait_published(1, WAIT_S)
    subscriber = KVEventSubscriber(
        publisher.endpoint, publisher.replay_endpoint, topic="kv-events", start_seq=0, context=context
    )
    counter = iter(range(1, 10_000))
    try:
        received = _receive_until(
            subscriber, lambda got: len(got) >= 3, lambda: publisher.publish(_batch(next(counter)))
        )
        assert [item.seq for item in received] == list(range(len(received)))
        assert received[0].batch == KVEventBatch(0.0, [BlockRemoved([0], "GPU")], 0)
    finally:
        subscriber.close()
        publisher.shutdown()


def test_from_config_and_array_wire_format(context: Any) -> None:
    config = KVEventsConfig(
        enable_kv_cache_events=True, endpoint="inproc://cfg", replay_endpoint="inproc://cfg-replay", topic="x"
    )
    publisher = ZmqEventPublisher.from_config(config, wire_format="array", context=context)
    dealer = context.socket(zmq.DEALER)
    dealer.connect("inproc://cfg-replay")
    try:
        assert (publisher.config.buffer_steps, publisher.endpoint) == (10_000, "inproc://cfg")
        publisher.publish(_batch(0))
        assert publisher.wait_published(1, WAIT_S)
        dealer.send_multipart([b"", _seq(0)])
        frames = _recv(dealer)
        assert frames[:3] == [b"", b"x", _seq(0)]
        assert frames[3] == encode_event_batch(KVEventBatch(0.0, [BlockRemoved([0], "GPU")], 0), "array")
    finally:
        dealer.close(linger=0)
        publisher.shutdown()
