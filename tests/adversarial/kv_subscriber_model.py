"""A plain reference model of the subscriber's documented rules, for the adversarial tests.

``SubscriberModel`` restates what ``kvstate.vllm.zmq_subscriber`` and
``zmq_replay`` document -- in order / gap / out of sequence, the held message
and its confirmation, resets and epochs, the replay range, the reply bounds --
as straight-line code over frame lists, with no sockets and no timing.  A
replay is modelled by calling the same scripted responder the test's replay
server uses; a reply without the end marker is modelled as read whole and then
timed out.  Mutable; owned by the test that builds it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from kvstate.vllm.kv_events import KVEventDecodeError, decode_event_batch
from kvstate.vllm.zmq_framing import END_SEQ
from kvstate.vllm.zmq_stats import DropReason, SubscriberLimits

Frames = list[bytes]


class SubscriberModel:
    """Feed it the live frame lists in order; read the outcome attributes."""

    def __init__(self, limits: SubscriberLimits,
                 respond: Callable[[int], list[Frames]] | None = None) -> None:
        self.limits = limits
        self.respond = respond
        self.delivered: list[tuple[int, int]] = []  # (seq, epoch)
        self.drops: Counter[DropReason] = Counter()
        self.missed: list[tuple[int, int]] = []
        self.replayed = self.resets = self.epoch = self.cut_short = 0
        self.last: int | None = None
        self.last_payload: bytes | None = None
        self.held: tuple[int, bytes] | None = None

    def feed(self, frames: Frames) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self.drops[DropReason.MALFORMED_FRAMES] += 1
            return
        seq, payload = int.from_bytes(frames[1], "big"), frames[2]
        if self.held is not None:
            held_seq, held_payload = self.held
            self.held = None
            if seq == held_seq + 1:  # a restart or renumbering: a new epoch
                self.resets += 1
                self.epoch += 1
                self.last = self.last_payload = None
                if 0 < held_seq <= self.limits.max_seq_gap:
                    self._fill(0, held_seq)
                self._accept(held_seq, held_payload)
                self._accept(seq, payload)
                return
            stray = self.last is not None and held_seq <= self.last
            self.drops[DropReason.DUPLICATE if stray else DropReason.SEQ_JUMP] += 1
        gap = self.limits.max_seq_gap
        if self.last is None or self.last + 1 <= seq <= self.last + gap:
            if self.last is not None and seq > self.last + 1:
                self._fill(self.last + 1, seq)
            self._accept(seq, payload)
        elif seq == self.last and payload == self.last_payload:
            self.drops[DropReason.DUPLICATE] += 1
        else:
            self.held = (seq, payload)

    def _accept(self, seq: int, payload: bytes) -> None:
        oversized = len(payload) > self.limits.max_payload_bytes
        self.last, self.last_payload = seq, None if oversized else payload
        if oversized:
            self.drops[DropReason.OVERSIZED] += 1
            return
        try:
            decode_event_batch(payload)
        except KVEventDecodeError:
            self.drops[DropReason.UNDECODABLE] += 1
            return
        self.delivered.append((seq, self.epoch))

    def _fill(self, start: int, stop: int) -> None:
        expected = start
        for seq, payload in self._replay(start, stop):
            if seq > expected:
                self.missed.append((expected, seq - 1))
            self.replayed += 1
            self._accept(seq, payload)
            expected = seq + 1
        if expected < stop:
            self.missed.append((expected, stop - 1))

    def _replay(self, start: int, stop: int) -> list[tuple[int, bytes]]:
        if self.respond is None:
            return []
        kept: dict[int, bytes] = {}
        kept_bytes = 0
        for count, frames in enumerate(self.respond(start), 1):
            if count > self.limits.max_replay_batches:
                break
            if len(frames) not in (2, 3) or len(frames[-2]) != 8:
                self.drops[DropReason.REPLAY_MALFORMED] += 1
                continue
            if frames[-2] == END_SEQ:
                return sorted(kept.items())
            seq = int.from_bytes(frames[-2], "big")
            if not start <= seq < stop or seq in kept:
                continue
            kept_bytes += len(frames[-1])
            if kept_bytes > self.limits.max_replay_bytes:
                break
            kept[seq] = frames[-1]
        self.cut_short += 1  # a bound was hit, or the reply never ended (a timeout)
        return sorted(kept.items())
