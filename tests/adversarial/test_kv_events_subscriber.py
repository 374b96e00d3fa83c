"""Adversarial: ``KVEventSubscriber`` fed hostile messages over a real inproc socket.

Properties checked after any hostile stream (frames of the wrong shape,
hostile payloads, absurd and repeated sequence numbers, a replay socket that
answers with junk or never finishes):

* ``receive`` never raises, and every live message is read;
* nothing is lost silently: delivered + dropped + held == received + replayed;
* within an epoch, delivered sequence numbers strictly increase;
* what is delivered (and in which epoch), what is dropped (and why), what is
  missed and how often replay was cut short equal a plain model of the
  documented rules (``kv_subscriber_model``);
* an honest continuation sent afterwards is delivered (the stream recovers);
* memory stays flat over thousands of hostile messages (a seeded run).
"""

from __future__ import annotations

import itertools
import random
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

zmq = pytest.importorskip("zmq")

from kvstate.vllm.zmq_framing import END_SEQ  # noqa: E402
from kvstate.vllm.zmq_stats import (  # noqa: E402
    DROPPED_SAMPLE_CAP,
    MISSED_RANGES_KEPT,
    DropReason,
    SubscriberLimits,
    SubscriberStats,
)
from kvstate.vllm.zmq_subscriber import SequencedBatch  # noqa: E402
from tests.adversarial.kv_hostile import hostile_payload, sized_payload, valid_payload  # noqa: E402
from tests.adversarial.kv_strategies import SEQ_MAX, payloads, sequence_steps  # noqa: E402
from tests.adversarial.kv_subscriber_model import SubscriberModel  # noqa: E402
from tests.adversarial.kv_wire import ReplayServer, Wire, seq_frame  # noqa: E402

Message = tuple[tuple[str, int], bytes, str]
LIMITS_PAYLOAD = 4096
LIMITS = SubscriberLimits(max_payload_bytes=LIMITS_PAYLOAD, max_seq_gap=1000, max_replay_batches=50)
_names = itertools.count()
_context = zmq.Context.instance()


@pytest.fixture
def context() -> Iterator[Any]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def accounted(stats: SubscriberStats) -> int:
    """Messages the subscriber has an outcome for (replay_malformed is not a batch)."""
    dropped = sum(count for reason, count in stats.dropped.items() if reason != DropReason.REPLAY_MALFORMED)
    return stats.delivered + dropped + (stats.held_seq is not None)


def next_seq(step: tuple[str, int], previous: int) -> int:
    kind, value = step
    if kind == "next":
        return min(previous + 1, SEQ_MAX)
    if kind == "delta":
        return min(max(previous + value, 0), SEQ_MAX)
    return value


def frames_for(shape: str, seq: int, payload: bytes) -> list[bytes]:
    if shape == "one_frame":
        return [payload]
    if shape == "four_frames":
        return [b"", seq_frame(seq), payload, b"extra"]
    if shape == "short_seq":
        return [b"", seq_frame(seq)[:5], payload]
    return [b"", seq_frame(seq), payload]


_valid = (st.builds(valid_payload, st.integers(0, 10**6))
          | st.builds(sized_payload, st.sampled_from([LIMITS_PAYLOAD, LIMITS_PAYLOAD + 1])))
_shapes = st.sampled_from(["ok"] * 12 + ["one_frame", "four_frames", "short_seq"])
_step = st.tuples(sequence_steps(), _valid | _valid | payloads(), _shapes)
_message = _step | _step | _step | st.none()  # None: the previous message again, byte for byte
# For the replay test: more small gaps, so that replay is asked for often.
_gap_step = st.tuples(st.tuples(st.just("delta"), st.integers(2, 6)), _valid, _shapes)
_gappy_message = _step | _gap_step | _gap_step | st.none()
_replies = st.lists(
    st.one_of(
        st.tuples(st.integers(0, 3) | st.integers(0, 3) | st.integers(0, 40),
                  st.builds(valid_payload, st.integers(0, 10**6)) | payloads()),
        st.sampled_from([("junk", b"x"), ("short", b"y")])),
    min_size=2, max_size=8)


def responder(script: list[tuple[Any, bytes]], finish: bool) -> Any:
    def respond(start: int) -> list[list[bytes]]:
        out: list[list[bytes]] = []
        for where, payload in script:
            if where == "junk":
                out.append([payload])
            elif where == "short":
                out.append([b"", b"\x01", payload])
            else:
                out.append([b"", seq_frame(min(start + where, SEQ_MAX)), payload])
        return out + ([[b"", END_SEQ, b""]] if finish else [])
    return respond


def check_epochs(got: list[SequencedBatch]) -> None:
    for _, group in itertools.groupby(got, key=lambda item: item.epoch):
        seqs = [item.seq for item in group]
        assert seqs == sorted(set(seqs)), f"not increasing within an epoch: {seqs}"
    assert [item.epoch for item in got] == sorted(item.epoch for item in got)


def honest_tail(wire: Wire) -> list[SequencedBatch]:
    """Send three valid batches continuing the stream; they must all be delivered."""
    last = wire.subscriber.stats.last_seq
    first = last + 1 if last is not None and last + 3 <= SEQ_MAX else 0
    markers = [7_000_001, 7_000_002, 7_000_003]
    for offset, marker in enumerate(markers):
        wire.send(first + offset, valid_payload(marker))
    got = wire.pump()
    assert [item.batch.ts for item in got[-3:]] == [float(m) for m in markers]
    return got


def send_all(wire: Wire, messages: list[Message | None], first: int) -> list[list[bytes]]:
    """Send the drawn messages; the frames actually sent."""
    seq = first
    previous: list[bytes] | None = None
    sent: list[list[bytes]] = []
    for message in messages:
        if message is not None:
            step, payload, shape = message
            seq = next_seq(step, seq)
            previous = frames_for(shape, seq, payload)
        if previous is not None:
            sent.append(previous)
            wire.send_frames(previous)
    return sent


def check_recovery(wire: Wire, got: list[SequencedBatch]) -> None:
    stats = wire.subscriber.stats
    assert stats.received == wire.sent
    assert accounted(stats) == stats.received + stats.replayed
    got += honest_tail(wire)
    check_epochs(got)
    assert len(wire.subscriber.dropped_samples) <= DROPPED_SAMPLE_CAP


def check_against_model(wire: Wire, got: list[SequencedBatch], model: SubscriberModel) -> None:
    stats = wire.subscriber.stats
    assert [(item.seq, item.epoch) for item in got] == model.delivered
    assert {reason: count for reason, count in stats.dropped.items() if count} == dict(model.drops)
    assert (stats.epoch, stats.resets, stats.replayed) == (model.epoch, model.resets, model.replayed)
    assert wire.subscriber.missed == model.missed[-MISSED_RANGES_KEPT:]
    assert stats.missed_batches == sum(last - first + 1 for first, last in model.missed)
    assert stats.replays_cut_short == model.cut_short
    assert stats.held_seq == (model.held[0] if model.held is not None else None)


@given(st.lists(_message, min_size=8, max_size=40), st.integers(0, 3) | st.integers(0, SEQ_MAX))
def test_hostile_streams_follow_the_documented_rules(messages: list[Message | None], first: int) -> None:
    wire = Wire(_context, f"adv-{next(_names)}", limits=LIMITS)
    try:
        sent = send_all(wire, messages, first)
        got = wire.pump()
        model = SubscriberModel(LIMITS)
        for frames in sent:
            model.feed(frames)
        check_against_model(wire, got, model)
        check_recovery(wire, got)
    finally:
        wire.close()


@given(st.lists(_gappy_message, min_size=4, max_size=20), _replies, st.sampled_from([True, True, False]),
       st.integers(0, 3) | st.integers(0, SEQ_MAX))
def test_hostile_replay_answers_are_survived_and_accounted_for(
        messages: list[Message | None], replies: list[tuple[Any, bytes]], finish: bool, first: int) -> None:
    """With the end marker the reply is read deterministically and must match the
    model; without it every request times out, and only the invariants are checked."""
    name = f"adv-{next(_names)}"
    respond = responder(replies, finish)
    server = ReplayServer(_context, f"inproc://{name}-replay", respond)
    wire = Wire(_context, name, limits=LIMITS, replay_timeout_s=5.0 if finish else 0.05,
                replay_endpoint=server.endpoint)
    try:
        sent = send_all(wire, messages, first)
        got = wire.pump()
        if finish:
            model = SubscriberModel(LIMITS, respond)
            for frames in sent:
                model.feed(frames)
            check_against_model(wire, got, model)
        check_recovery(wire, got)
    finally:
        wire.close()
        server.close()


def test_memory_stays_flat_over_thousands_of_hostile_messages(context: Any) -> None:
    rng = random.Random(2024)
    pool = [hostile_payload(rng)[1] for _ in range(300)] + [valid_payload(i) for i in range(100)]
    wire = Wire(context, "adv-memory", limits=SubscriberLimits(max_payload_bytes=65536, max_seq_gap=100))
    seq = 0

    def feed(count: int) -> None:
        nonlocal seq
        for index in range(count):
            roll = rng.random()
            if roll < 0.05:
                wire.send(rng.choice([0, SEQ_MAX, seq + 10**6, max(seq - 3, 0)]), rng.choice(pool))
            elif roll < 0.08:
                wire.send_frames([rng.choice(pool)])
            else:
                seq += 1 + (roll < 0.1) * rng.randrange(1, 50)  # some gaps, no replay socket
                wire.send(seq, rng.choice(pool))
            if index % 200 == 199:
                wire.pump()
        wire.pump()

    try:
        feed(1000)  # warm up: samples and missed ranges fill to their caps
        tracemalloc.start()
        baseline = tracemalloc.get_traced_memory()[0]
        feed(3000)
        grown = tracemalloc.get_traced_memory()[0] - baseline
        tracemalloc.stop()
        stats = wire.subscriber.stats
        assert grown < 1 * 2**20, f"grew {grown / 2**20:.2f} MiB over 3000 hostile messages"
        assert stats.dropped_total > 1000 and stats.delivered > 300
        assert len(wire.subscriber.missed) == MISSED_RANGES_KEPT
        assert accounted(stats) == stats.received + stats.replayed
    finally:
        wire.close()
