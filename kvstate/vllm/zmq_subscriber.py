"""KV-event subscriber over ZeroMQ that survives anything on the wire.

:class:`KVEventSubscriber` reads a publisher's PUB socket and, through
:class:`~kvstate.vllm.zmq_replay.ReplayClient`, its replay ROUTER (the SUB
socket itself is a :class:`~kvstate.vllm.zmq_live.LiveSocket`, re-made after a
dropped connection).  It is
meant to serve a router, so wire content never makes :meth:`receive` raise:
a hostile or broken message is dropped and counted by reason
(:attr:`KVEventSubscriber.stats`, a frozen :class:`SubscriberStats`), with the
newest ``DROPPED_SAMPLE_CAP`` of them kept truncated for diagnosis.  Memory
is bounded by :class:`SubscriberLimits`, not by what a message declares.

Sequence numbers (vLLM numbers each publisher process's batches 0, 1, 2, ...;
PUB/SUB neither reorders nor repeats, it only drops):

* ``seq == last + 1``: in order.
* ``last + 1 < seq <= last + max_seq_gap``: a gap (the PUB socket dropped
  messages).  The missing range is asked of the replay socket; what it cannot
  supply (rolled out of its buffer, or no replay socket) is recorded as missed.
* anything else (``seq <= last`` or a larger jump) is *out of sequence*: a
  stray (a repeated or corrupt message) or a publisher that restarted
  (counting from 0 again) or renumbered.  The message is held (at most one)
  and the next live message decides: if it is numbered ``held + 1`` the
  publisher really counts from there, a **reset**: ``epoch`` goes up, the
  batches of the new numbering before ``held`` are asked of the replay socket
  from 0 (a restarted vLLM publisher counts from 0; skipped for a jump past
  ``max_seq_gap``), then the held batch and the new one are delivered.
  Otherwise the held message is dropped as a ``DUPLICATE`` (it was numbered
  at or below ``last``) or a ``SEQ_JUMP``.  A message repeating the last
  sequence number with the same bytes is a duplicate at once (unless the last
  was oversized: its bytes are not kept).

A consumer that sees a batch's ``epoch`` change should rebuild what it
derived from this publisher: the engine behind it restarted (or the stream
lost more than replay can restore).  A held message is only confirmed by the
*next* live message, so it waits while the publisher is idle.

Ownership: the subscriber is single-threaded and owns its sockets (call
:meth:`KVEventSubscriber.close`).  :class:`SequencedBatch` is frozen.  Needs
the optional ``pyzmq`` package.
"""

from __future__ import annotations

import collections
from typing import Any

import attrs
import zmq

from kvstate.vllm.kv_events import KVEventBatch, KVEventDecodeError, decode_event_batch
from kvstate.vllm.zmq_framing import SEQ_BYTES
from kvstate.vllm.zmq_live import LiveSocket
from kvstate.vllm.zmq_replay import ReplayClient
from kvstate.vllm.zmq_stats import (
    MISSED_RANGES_KEPT,
    DropLedger,
    DroppedSample,
    DropReason,
    SubscriberLimits,
    SubscriberStats,
)

__all__ = ["KVEventSubscriber", "SequencedBatch"]


@attrs.frozen
class SequencedBatch:
    """A decoded batch with the publisher's sequence number and the subscriber's
    epoch (incremented on every publisher reset)."""

    seq: int
    batch: KVEventBatch
    epoch: int = 0


@attrs.frozen
class _Message:
    seq: int
    payload: bytes  # empty when oversized: the bytes are not kept
    size: int


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
        limits: SubscriberLimits | None = None,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        if start_seq is not None and not 0 <= start_seq < 1 << (8 * SEQ_BYTES):
            raise ValueError(f"start_seq must be in 0..2**64-1, got {start_seq}")
        self.limits = limits or SubscriberLimits()
        self._context = context or zmq.Context.instance()
        self._live = LiveSocket(self._context, endpoint, topic, self.limits)
        self._ledger = DropLedger()
        self._replay = (ReplayClient(self._context, replay_endpoint, replay_timeout_s, self.limits,
                                     self._ledger) if replay_endpoint is not None else None)
        self._start_seq = start_seq
        self.last_seq: int | None = None
        self.epoch = 0
        self._last_payload: bytes | None = None  # to recognise an exact repeat of the last message
        self._held: _Message | None = None
        self._missed: collections.deque[tuple[int, int]] = collections.deque(maxlen=MISSED_RANGES_KEPT)
        self._counts = collections.Counter[str]()
        self._ready: collections.deque[SequencedBatch] = collections.deque()

    # ------------------------------------------------------------------ public

    def close(self) -> None:
        """Close the sockets (idempotent)."""
        self._live.close()
        if self._replay is not None:
            self._replay.close()

    @property
    def stats(self) -> SubscriberStats:
        """A frozen snapshot of the counters."""
        counts = self._counts
        return SubscriberStats(
            received=counts["received"], delivered=counts["delivered"],
            dropped=self._ledger.snapshot(), replay_requests=self.replay_requests,
            replayed=counts["replayed"], replay_overlap=counts["replay_overlap"],
            replays_cut_short=self._replay.cut_short if self._replay is not None else 0,
            missed_batches=counts["missed"], resets=counts["resets"], reconnects=self._live.reconnects,
            epoch=self.epoch,
            last_seq=self.last_seq, held_seq=self._held.seq if self._held is not None else None)

    @property
    def replay_requests(self) -> int:
        return self._replay.requests if self._replay is not None else 0

    @property
    def missed(self) -> list[tuple[int, int]]:
        """The newest ``MISSED_RANGES_KEPT`` inclusive ranges that neither the live
        stream nor replay supplied (``stats.missed_batches`` counts every one)."""
        return list(self._missed)

    @property
    def dropped_samples(self) -> tuple[DroppedSample, ...]:
        """The newest dropped messages (at most ``DROPPED_SAMPLE_CAP``), truncated."""
        return tuple(self._ledger.samples)

    def receive(self, timeout_s: float) -> list[SequencedBatch]:
        """Wait up to ``timeout_s`` for the next live message; return every batch
        now deliverable, in order (replayed ones first).  ``[]`` on timeout or
        when the message was dropped or held.  Never raises for wire content;
        after a dropped connection it reads what was still queued and reconnects
        (:mod:`kvstate.vllm.zmq_live`)."""
        for frames in self._live.receive(timeout_s):
            self._on_live(frames)
        ready = list(self._ready)
        self._ready.clear()
        return ready

    def request_replay(self, start_seq: int, stop_seq: int | None = None) -> list[tuple[int, bytes]]:
        """Ask the replay socket for the buffered batches from ``start_seq`` (below
        ``stop_seq`` if given); raw ``(seq, payload)`` pairs, ascending, bounded
        by the limits.  ``[]`` without a replay socket."""
        if self._replay is None:
            return []
        result = self._replay.fetch(start_seq, stop_seq)
        self._counts["replay_overlap"] += result.overlap
        return list(result.pairs)

    # ------------------------------------------------------------------ sequencing

    def _on_live(self, frames: list[bytes]) -> None:
        self._counts["received"] += 1
        if len(frames) != 3 or len(frames[1]) != SEQ_BYTES:
            self._ledger.drop(DropReason.MALFORMED_FRAMES, None, frames[-1] if frames else b"",
                              f"{len(frames)} frames, sizes {[len(f) for f in frames[:4]]}")
            return
        payload = frames[2]
        size = len(payload)
        if size > self.limits.max_payload_bytes:
            payload = b""
        self._sequence(_Message(int.from_bytes(frames[1], "big"), payload, size))

    def _sequence(self, message: _Message) -> None:
        held, self._held = self._held, None
        if held is not None:
            if message.seq == held.seq + 1:
                self._reset(held)
                self._accept(message)
                return
            reason = DropReason.DUPLICATE if self._at_or_below_last(held.seq) else DropReason.SEQ_JUMP
            self._drop(reason, held, "not followed by its successor")
        last = self.last_seq
        if last is None:
            start = self._start_seq
            if start is not None and start < message.seq <= start + self.limits.max_seq_gap:
                self._fill(start, message.seq)
            self._accept(message)
        elif message.seq == last + 1:
            self._accept(message)
        elif last + 1 < message.seq <= last + self.limits.max_seq_gap:
            self._fill(last + 1, message.seq)
            self._accept(message)
        elif message.seq == last and message.payload == self._last_payload:
            self._drop(DropReason.DUPLICATE, message, "repeats the last message")
        else:
            self._held = message

    def _at_or_below_last(self, seq: int) -> bool:
        return self.last_seq is not None and seq <= self.last_seq

    def _reset(self, held: _Message) -> None:
        """The publisher restarted or renumbered at ``held.seq``: a new epoch."""
        self._counts["resets"] += 1
        self.epoch += 1
        self.last_seq = None
        self._last_payload = None
        if 0 < held.seq <= self.limits.max_seq_gap:
            self._fill(0, held.seq)
        self._accept(held)

    def _fill(self, first_missing: int, live_seq: int) -> None:
        """Replay ``first_missing .. live_seq - 1``; record what stays missing."""
        pairs = self.request_replay(first_missing, live_seq)
        next_expected = first_missing
        for seq, payload in pairs:
            if seq > next_expected:
                self._miss(next_expected, seq - 1)
            self._counts["replayed"] += 1
            self._accept(_Message(seq, payload if len(payload) <= self.limits.max_payload_bytes
                                  else b"", len(payload)))
            next_expected = seq + 1
        if next_expected < live_seq:
            self._miss(next_expected, live_seq - 1)

    def _miss(self, first: int, last: int) -> None:
        self._missed.append((first, last))
        self._counts["missed"] += last - first + 1

    def _accept(self, message: _Message) -> None:
        """Advance to ``message.seq`` and deliver its batch, or drop its content."""
        self.last_seq = message.seq
        oversized = message.size > self.limits.max_payload_bytes
        self._last_payload = None if oversized else message.payload  # oversized bytes are not kept
        if oversized:
            self._drop(DropReason.OVERSIZED, message, f"limit {self.limits.max_payload_bytes}")
            return
        try:
            batch = decode_event_batch(message.payload)
        except KVEventDecodeError as error:
            self._drop(DropReason.UNDECODABLE, message, str(error))
            return
        self._counts["delivered"] += 1
        self._ready.append(SequencedBatch(message.seq, batch, self.epoch))

    def _drop(self, reason: DropReason, message: _Message, detail: str) -> None:
        self._ledger.drop(reason, message.seq, message.payload, detail, size=message.size)
