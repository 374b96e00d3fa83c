"""What the ZMQ KV-event subscriber drops, counts and keeps for diagnosis.

:class:`SubscriberLimits` holds every bound the subscriber puts on untrusted
input (documented in ``docs/vllm.md``, "Limits on untrusted input");
:class:`SubscriberStats` is a frozen snapshot of its counters;
:class:`DroppedSample` is one entry of the small diagnosis sample.
:class:`DropLedger` owns the live counters and the sample; only its
subscriber mutates it.  The other classes are frozen.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Mapping
from types import MappingProxyType

import attrs

__all__ = [
    "DROPPED_SAMPLE_CAP",
    "MISSED_RANGES_KEPT",
    "SAMPLE_HEAD_BYTES",
    "DropLedger",
    "DropReason",
    "DroppedSample",
    "SubscriberLimits",
    "SubscriberStats",
]

DROPPED_SAMPLE_CAP = 16
"""Most dropped messages kept for diagnosis (the newest; older ones are forgotten)."""
SAMPLE_HEAD_BYTES = 64
"""Bytes of a dropped payload kept in its sample."""
_SAMPLE_DETAIL_CHARS = 200
MISSED_RANGES_KEPT = 64
"""Most recent missed sequence ranges listed; ``missed_batches`` counts them all."""


class DropReason(enum.StrEnum):
    """Why a message from the wire was not delivered."""

    MALFORMED_FRAMES = "malformed_frames"
    """A live message that is not ``[topic, 8-byte seq, payload]``."""
    OVERSIZED = "oversized"
    """A payload over ``SubscriberLimits.max_payload_bytes``."""
    UNDECODABLE = "undecodable"
    """A payload that is not a KV event batch (``KVEventDecodeError``)."""
    DUPLICATE = "duplicate"
    """A live message numbered at or below the last delivered one, not followed by
    its successor (so not a publisher restart)."""
    SEQ_JUMP = "seq_jump"
    """A live message numbered more than ``max_seq_gap`` ahead, not followed by its
    successor (so not a renumbered publisher)."""
    REPLAY_MALFORMED = "replay_malformed"
    """A replay reply message of the wrong shape, or one nobody asked for."""


@attrs.frozen
class SubscriberLimits:
    """Bounds on what one subscriber holds, whatever the wire declares.

    ``max_payload_bytes``: larger payloads are dropped (``OVERSIZED``); over
    tcp/ipc libzmq refuses such frames itself (``ZMQ_MAXMSGSIZE``: the
    connection is dropped and re-made, and the loss shows up as a gap).
    ``max_seq_gap``: a forward jump up to this many batches is a gap, filled by
    replay; a larger one is held until confirmed (see the subscriber).
    ``max_replay_batches`` / ``max_replay_bytes``: one replay reply is read up
    to either bound, then abandoned (what it did not supply counts as missed).
    ``rcvhwm``: messages libzmq may queue for the SUB socket.
    """

    max_payload_bytes: int = 4 * 1024 * 1024
    max_seq_gap: int = 1 << 16
    max_replay_batches: int = 10_000
    max_replay_bytes: int = 64 * 1024 * 1024
    rcvhwm: int = 1000

    def __attrs_post_init__(self) -> None:
        for name, value in attrs.asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")


@attrs.frozen
class DroppedSample:
    """One dropped message: why, its sequence number if it had one, its size,
    its first ``SAMPLE_HEAD_BYTES`` bytes and a short detail (the decode error)."""

    reason: DropReason
    seq: int | None
    size: int
    head: bytes
    detail: str


@attrs.frozen
class SubscriberStats:
    """A snapshot of a subscriber's counters (see ``KVEventSubscriber.stats``).

    ``received``: live messages read; ``delivered``: batches returned by
    ``receive``; ``dropped``: messages dropped, by reason; ``replayed``:
    batches recovered by replay; ``replay_overlap``: replayed messages ignored
    because they fell outside the requested range (normal: a reply carries
    everything buffered from the start asked for); ``replays_cut_short``:
    replies abandoned at a bound or the timeout; ``missed_batches``: sequence
    numbers neither received nor replayed; ``resets``: publisher restarts or
    renumberings (each starts a new ``epoch``); ``reconnects``: dropped
    connections made again (libzmq ends a connection that sent a frame over
    ``max_payload_bytes``); ``held_seq``: the out-of-sequence message waiting
    for confirmation, if any.
    """

    received: int
    delivered: int
    dropped: Mapping[DropReason, int]
    replay_requests: int
    replayed: int
    replay_overlap: int
    replays_cut_short: int
    missed_batches: int
    resets: int
    reconnects: int
    epoch: int
    last_seq: int | None
    held_seq: int | None

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())


@attrs.define
class DropLedger:
    """Drop counters by reason plus the bounded sample (owned by one subscriber)."""

    counts: dict[DropReason, int] = attrs.field(factory=lambda: dict.fromkeys(DropReason, 0))
    samples: collections.deque[DroppedSample] = attrs.field(
        factory=lambda: collections.deque(maxlen=DROPPED_SAMPLE_CAP))

    def drop(self, reason: DropReason, seq: int | None, payload: bytes, detail: str = "",
             size: int | None = None) -> None:
        """Count one dropped message and keep a truncated sample of it."""
        self.counts[reason] += 1
        self.samples.append(DroppedSample(
            reason, seq, len(payload) if size is None else size,
            bytes(payload[:SAMPLE_HEAD_BYTES]), detail[:_SAMPLE_DETAIL_CHARS]))

    def snapshot(self) -> Mapping[DropReason, int]:
        return MappingProxyType(dict(self.counts))
