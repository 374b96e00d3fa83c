"""Soak: one ``KVEventSubscriber`` fed a long mix of hostile and valid messages.

    PYTHONPATH=. python tools/soak_subscriber.py [--messages 1000000] [--hostile 0.5]
                                                  [--report-every 100000] [--seed 1]

Not run in CI.  A publisher (an XPUB socket, plus a replay ROUTER thread that
keeps the last 10,000 in-sequence batches as vLLM's does) and the subscriber
share one process over inproc.  The publisher sends in chunks of ``--chunk``
messages and the subscriber drains each chunk, so no message is lost to a
high-water mark and throughput is the subscriber's own (decode, sequencing,
replay, drops).  The hostile share is drawn from ``tests/adversarial/
kv_hostile.py`` (undecodable and deep payloads, wrong types, random bytes up
to 100 kB), plus malformed frames, stray and absurd sequence numbers,
oversized payloads, gaps that replay must fill, and a publisher restart every
``--restart-every`` messages.  Early on, two large gaps make replays run
into the reply bounds (batch count, then bytes), so the first report's RSS
already includes the largest transient the limits allow; the harness's
replay server sends no more than the subscriber reads before abandoning a
reply, so its own queue stays small.  Every ``--report-every`` messages it prints
throughput, the raw resident memory (RSS), the RSS after a full collection
and ``malloc_trim(0)`` (free heap pages handed back to the OS, so allocator
high-water marks from bounded transients do not count), and the number of
live Python objects.  The run passes when neither the trimmed RSS nor the
object count ever exceeds the first report's by more than ``--tolerance``
(default 5%); the raw RSS growth is printed too.  Exit 0 pass, 1 fail.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import ctypes.util
import gc
import json
import os
import random
import sys
import threading
import time
from typing import Any

import zmq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvstate.vllm.zmq_framing import END_SEQ  # noqa: E402
from kvstate.vllm.zmq_stats import SubscriberLimits  # noqa: E402
from kvstate.vllm.zmq_subscriber import KVEventSubscriber  # noqa: E402
from tests.adversarial.kv_hostile import hostile_payload, sized_payload, valid_payload  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")
REPLAY_BUFFER = 10_000
# Tighter replay bounds than the defaults, so the bounded worst case is reached early.
LIMITS = SubscriberLimits(max_payload_bytes=256 * 1024, max_replay_batches=2000,
                          max_replay_bytes=8 * 1024 * 1024)
# Warm-up gaps (message index -> batches skipped, their size): one replay reaches the
# count bound, one the byte bound, before the first report.
WARMUP_GAPS = {1000: (2500, 200), 2000: (400, 60_000)}


def rss_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE / 2**20


def _libc_trim() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: report the raw RSS only
        return None


MALLOC_TRIM = _libc_trim()


def memory_now() -> tuple[float, float, int]:
    """Raw RSS, RSS after a full collection and ``malloc_trim(0)`` (free heap pages
    handed back, so what remains is what is held), and the live Python objects."""
    raw = rss_mib()
    gc.collect()
    if MALLOC_TRIM is not None:
        MALLOC_TRIM(0)
    return raw, rss_mib(), len(gc.get_objects())


class Publisher:
    """XPUB + replay ROUTER thread; ``buffer`` holds the last in-sequence batches."""

    def __init__(self, context: Any) -> None:
        self.pub = context.socket(zmq.XPUB)
        self.pub.bind("inproc://soak")
        self.router = context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.SNDHWM, 2 * (REPLAY_BUFFER + 1))
        self.router.bind("inproc://soak-replay")
        self.buffer: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=REPLAY_BUFFER)
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(20):
                continue
            frames = self.router.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                continue
            start = int.from_bytes(frames[2], "big")
            with self.lock:
                replies = [(seq, payload) for seq, payload in self.buffer if seq >= start]
            # Send no more than the subscriber reads before it abandons a reply: the
            # harness shares the process, and its own queue must not inflate the RSS.
            sent_bytes = 0
            for count, (seq, payload) in enumerate(replies, 1):
                self.router.send_multipart([frames[0], b"", b"", seq.to_bytes(8, "big"), payload])
                sent_bytes += len(payload)
                if count > LIMITS.max_replay_batches or sent_bytes > LIMITS.max_replay_bytes:
                    break
            else:
                self.router.send_multipart([frames[0], b"", b"", END_SEQ, b""])

    def send(self, frames: list[bytes]) -> None:
        self.pub.send_multipart(frames)

    def record(self, seq: int, payload: bytes) -> None:
        with self.lock:
            self.buffer.append((seq, payload))

    def restart(self) -> None:
        with self.lock:
            self.buffer.clear()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.pub.close(linger=0)
        self.router.close(linger=0)


class Feed:
    """Draws the next message: a valid batch, or one of the hostile kinds."""

    def __init__(self, rng: random.Random, hostile_share: float) -> None:
        self.rng = rng
        self.hostile_share = hostile_share
        self.valid = [valid_payload(i) for i in range(500)] + [sized_payload(s) for s in range(200, 8000, 40)]
        self.hostile = [hostile_payload(rng)[1] for _ in range(1000)]
        self.oversized = sized_payload(LIMITS.max_payload_bytes + 1000)
        self.seq = -1

    def next(self, publisher: Publisher, index: int) -> None:
        rng = self.rng
        if index in WARMUP_GAPS:
            self._gap(publisher, *WARMUP_GAPS[index])
            return
        if rng.random() >= self.hostile_share:
            self._in_sequence(publisher, rng.choice(self.valid))
            return
        roll = rng.random()
        if roll < 0.70:
            self._in_sequence(publisher, rng.choice(self.hostile))
        elif roll < 0.80:
            publisher.send(rng.choice([[b"x"], [b"", b"bad-seq", b"p"], [b"", b"", b"", b""]]))
        elif roll < 0.90:  # a stray: an old or absurd number, dropped when the stream goes on
            stray = rng.choice([max(self.seq - rng.randrange(1, 50), 0), 2**64 - 1, self.seq + 10**9])
            publisher.send([b"", stray.to_bytes(8, "big"), rng.choice(self.valid)])
        elif roll < 0.95:
            self._in_sequence(publisher, self.oversized)
        else:
            self._gap(publisher, rng.randrange(1, 6))

    def _gap(self, publisher: Publisher, size: int, payload_bytes: int | None = None) -> None:
        """``size`` batches reach only the replay buffer (the PUB socket dropped them)."""
        big = sized_payload(payload_bytes) if payload_bytes is not None else None
        for _ in range(size):
            self.seq += 1
            publisher.record(self.seq, big if big is not None else self.rng.choice(self.valid))
        self._in_sequence(publisher, self.rng.choice(self.valid))

    def _in_sequence(self, publisher: Publisher, payload: bytes) -> None:
        self.seq += 1
        publisher.record(self.seq, payload)
        publisher.send([b"", self.seq.to_bytes(8, "big"), payload])

    def restart(self, publisher: Publisher) -> None:
        """The engine restarts: numbering from 0; the first few batches are missed live."""
        publisher.restart()
        self.seq = -1
        for _ in range(self.rng.randrange(0, 4)):
            self.seq += 1
            publisher.record(self.seq, self.rng.choice(self.valid))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--hostile", type=float, default=0.5, help="share of hostile messages")
    parser.add_argument("--report-every", type=int, default=100_000)
    parser.add_argument("--restart-every", type=int, default=250_000)
    parser.add_argument("--chunk", type=int, default=100,
                        help="messages sent before the subscriber drains them (replay replies "
                             "carry everything buffered after a gap, so larger chunks cost more)")
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="also print the summary as JSON")
    args = parser.parse_args(argv)

    context = zmq.Context()
    publisher = Publisher(context)
    subscriber = KVEventSubscriber("inproc://soak", "inproc://soak-replay", context=context, limits=LIMITS)
    assert publisher.pub.poll(5000), "the subscriber never subscribed"
    publisher.pub.recv()
    feed = Feed(random.Random(args.seed), args.hostile)
    rows: list[dict[str, Any]] = []
    sent = 0
    start = last_time = time.perf_counter()
    print(f"{'messages':>10} {'msg/s':>9} {'RSS MiB':>8} {'trimmed':>8} {'objects':>8} {'delivered':>10} "
          f"{'dropped':>9} {'replayed':>9}")
    try:
        while sent < args.messages:
            chunk = min(args.chunk, args.messages - sent)
            for _ in range(chunk):
                if sent and sent % args.restart_every == 0:
                    feed.restart(publisher)
                feed.next(publisher, sent)
                sent += 1
            for _ in range(chunk):  # each call reads exactly one queued live message
                subscriber.receive(timeout_s=5.0)
            if sent % args.report_every == 0 or sent == args.messages:
                now = time.perf_counter()
                stats = subscriber.stats
                assert stats.received == sent, f"read {stats.received} of {sent}"
                interval = args.report_every if sent % args.report_every == 0 else sent % args.report_every
                raw, trimmed, objects = memory_now()
                row = {"messages": sent, "rate": interval / (now - last_time), "rss_mib": raw,
                       "trimmed_mib": trimmed, "objects": objects, "delivered": stats.delivered,
                       "dropped": stats.dropped_total, "replayed": stats.replayed}
                rows.append(row)
                print(f"{sent:>10,} {row['rate']:>9,.0f} {raw:>8.1f} {trimmed:>8.1f} {objects:>8,} "
                      f"{stats.delivered:>10,} {stats.dropped_total:>9,} {stats.replayed:>9,}", flush=True)
                last_time = time.perf_counter()  # the measurement itself is not timed
    finally:
        elapsed = time.perf_counter() - start
        stats = subscriber.stats
        subscriber.close()
        publisher.close()
        context.term()
    first, later = rows[0], rows[1:] or rows
    growth = {key: max(row[key] for row in later) / first[key] - 1
              for key in ("rss_mib", "trimmed_mib", "objects")}
    ok = growth["trimmed_mib"] <= args.tolerance and growth["objects"] <= args.tolerance
    summary = {"messages": sent, "seconds": round(elapsed, 1), "rate": round(sent / elapsed),
               "first_report": {key: round(first[key], 1) for key in ("rss_mib", "trimmed_mib", "objects")},
               "growth_pct": {key: round(100 * value, 2) for key, value in growth.items()}, "flat": ok,
               "delivered": stats.delivered, "replayed": stats.replayed, "resets": stats.resets,
               "missed_batches": stats.missed_batches, "replays_cut_short": stats.replays_cut_short,
               "dropped": {str(reason): count for reason, count in stats.dropped.items()}}
    pct = {key: f"{100 * value:+.2f}%" for key, value in growth.items()}
    print(f"{sent:,} messages in {elapsed:.1f} s ({sent / elapsed:,.0f} msg/s); largest growth over the "
          f"first report: RSS {pct['rss_mib']}, trimmed RSS {pct['trimmed_mib']}, objects {pct['objects']}: "
          f"{'flat' if ok else 'NOT flat'} within {args.tolerance:.0%}")
    print("dropped: " + ", ".join(f"{k} {v:,}" for k, v in summary["dropped"].items()))
    print(f"delivered {stats.delivered:,}, replayed {stats.replayed:,}, resets {stats.resets}, "
          f"missed {stats.missed_batches:,}, replays cut short {stats.replays_cut_short}")
    if args.json:
        print(json.dumps(summary))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
