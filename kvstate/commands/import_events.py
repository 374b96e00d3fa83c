"""``kvstate import-events``: a captured vLLM / SGLang KV-event stream -> a kvstate log.

    kvstate import-events FILE -o LOG [--salvage]
    kvstate import-events tcp://HOST:PORT [--replay-endpoint tcp://HOST:PORT2]
                          [--topic T] [--start-seq 0] [--idle-seconds 2] -o LOG

FILE is a msgpack stream: concatenated ``KVEventBatch`` payloads (map or array
form, vLLM 0.33 or SGLang), or ``[seq, payload]`` / ``[topic, seq, payload]``
frame lists as a subscriber would save them.  It is read twice, streaming, in
bounded memory.  An ENDPOINT (``tcp://``, ``ipc://``) is subscribed to until
nothing arrives for ``--idle-seconds`` (sequence gaps are filled from the
replay socket when one is given); what arrives is spooled to a temporary file
and imported from there, and a publisher restart becomes a clear.

The log holds the prefix index the events describe (stores -> inserts,
removes -> evictions of one copy, clears -> resets); check it with
``kvstate replay LOG``.

Exit codes: 0 clean; 1 the core refused an imported event; 2 malformed input
(the byte offset and the reason are named: bad msgpack, a capture cut off
inside a batch, a block size outside 1..65536, a store with too few token ids;
for an endpoint, messages dropped or batches missed) or a usage problem.
``--salvage`` makes malformed input an explicit, reported stop instead: a
file imports up to the first bad item and the report says where it stopped
and how many bytes it dropped; an endpoint's drops are reported and accepted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import IO, Any

from kvstate.errors import InvalidEvent
from kvstate.log.recorder import Recorder


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "import-events", help="turn a captured vLLM/SGLang KV-event stream into a log",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", metavar="FILE|ENDPOINT")
    parser.add_argument("-o", "--output", required=True, metavar="LOG")
    parser.add_argument("--replay-endpoint", default=None, metavar="ENDPOINT")
    parser.add_argument("--topic", default="")
    parser.add_argument("--start-seq", type=int, default=None, metavar="SEQ",
                        help="replay from this sequence number when subscribing")
    parser.add_argument("--idle-seconds", type=float, default=2.0, metavar="S",
                        help="stop subscribing after S seconds without a message (default 2)")
    parser.add_argument("--max-batches", type=int, default=None, metavar="N")
    parser.add_argument("--medium", default="GPU",
                        help="import events of this medium (default GPU; 'any' for all)")
    parser.add_argument("--max-item-bytes", type=int, default=None, metavar="N",
                        help="largest capture item (one batch) to read (default 16 MiB)")
    parser.add_argument("--salvage", action="store_true",
                        help="import what precedes malformed input and report what was dropped")
    parser.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    parser.set_defaults(func=run)


def _subscribe(args: argparse.Namespace, spool: IO[bytes]) -> dict[str, Any]:
    """Spool the endpoint's batches (a clear at each publisher reset) until it is
    idle for ``--idle-seconds``; returns the subscriber's counts."""
    from kvstate.vllm.kv_events import AllBlocksCleared, KVEventBatch, encode_event_batch
    from kvstate.vllm.zmq_events import KVEventSubscriber

    subscriber = KVEventSubscriber(args.source, args.replay_endpoint, args.topic,
                                   start_seq=args.start_seq)
    spooled = epoch = 0
    try:
        while args.max_batches is None or spooled < args.max_batches:
            before = subscriber.stats.received
            received = subscriber.receive(args.idle_seconds)
            if not received and subscriber.stats.received == before:
                break  # idle; a message that was dropped or held does not end the import
            for item in received:
                if args.max_batches is not None and spooled >= args.max_batches:
                    break
                if item.epoch != epoch:  # the engine restarted: its cache starts empty
                    epoch = item.epoch
                    spool.write(encode_event_batch(KVEventBatch(item.batch.ts, [AllBlocksCleared()])))
                spool.write(encode_event_batch(item.batch))
                spooled += 1
        stats = subscriber.stats
    finally:
        subscriber.close()
    return {"received": stats.received, "delivered": stats.delivered,
            "dropped": {str(reason): count for reason, count in stats.dropped.items() if count},
            "missed_batches": stats.missed_batches, "resets": stats.resets,
            "unconfirmed_held": 0 if stats.held_seq is None else 1}


def _lost(counts: dict[str, Any]) -> int:
    return sum(counts["dropped"].values()) + counts["missed_batches"] + counts["unconfirmed_held"]


def run(args: argparse.Namespace) -> int:
    from kvstate.vllm.capture import CaptureError, CaptureReader
    from kvstate.vllm.importer import BlockIndexImporter

    source = args.source
    limit = {} if args.max_item_bytes is None else {"max_item_bytes": args.max_item_bytes}
    if args.max_item_bytes is not None and args.max_item_bytes <= 0:
        print("kvstate import-events: --max-item-bytes must be positive", file=sys.stderr)
        return 2
    spool = tempfile.TemporaryFile() if source.startswith(("tcp://", "ipc://", "inproc://")) else None
    readers: list[CaptureReader] = []

    def open_source() -> CaptureReader:  # called once per importer pass
        if spool is not None:
            spool.seek(0)
            return CaptureReader(spool, **limit)
        readers.append(CaptureReader(source, **limit))
        return readers[-1]

    subscription = None
    try:
        if spool is not None:
            subscription = _subscribe(args, spool)
        importer = BlockIndexImporter(open_source, salvage=args.salvage,
                                      medium=None if args.medium == "any" else args.medium)
        meta = {"front_end": "kvstate import-events", "source": source,
                "block_size": importer.stats.block_size}
        with Recorder(importer.engine, args.output, meta=meta):
            importer.run()
    except InvalidEvent as exc:
        print(f"kvstate import-events: the core refused an imported event: {exc}", file=sys.stderr)
        return 1
    except (OSError, CaptureError, ValueError) as exc:
        print(f"kvstate import-events: {exc}", file=sys.stderr)
        return 2
    finally:
        for reader in readers:
            reader.close()
        if spool is not None:
            spool.close()
    return _report(args, importer, subscription)


def _report(args: argparse.Namespace, importer: Any, subscription: dict[str, Any] | None) -> int:
    counts: dict[str, Any] = importer.stats.to_json()
    stopped = importer.stopped
    salvage = None
    if stopped is not None:
        size = None if subscription is not None else os.path.getsize(args.source)
        dropped = None if size is None or stopped.offset is None else size - stopped.offset
        salvage = {"byte_offset": stopped.offset, "reason": stopped.reason,
                   "batches": importer.stats.batches, "bytes_dropped": dropped}
    lost = _lost(subscription) if subscription is not None else 0
    if args.json:
        out: dict[str, Any] = {"output": args.output, **counts}
        if salvage is not None:
            out["salvage"] = salvage
        if subscription is not None:
            out["subscriber"] = subscription
        print(json.dumps(out))
    else:
        print(f"wrote {args.output}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
        if salvage is not None:
            print(f"salvage: stopped at byte {salvage['byte_offset']}: {salvage['reason']}; imported "
                  f"the {salvage['batches']} batches before it, dropped {salvage['bytes_dropped']} bytes")
        if subscription is not None:
            print("subscriber: " + ", ".join(f"{k} {v}" for k, v in subscription.items()))
    if lost and not args.salvage:
        print(f"kvstate import-events: {lost} messages were dropped or missed on the wire (see the "
              "subscriber counts); the log holds the rest; pass --salvage to accept that",
              file=sys.stderr)
        return 2
    return 0
