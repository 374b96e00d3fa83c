"""``kvstate import-events``: a captured vLLM / SGLang KV-event stream -> a kvstate log.

    kvstate import-events FILE -o LOG
    kvstate import-events tcp://HOST:PORT [--replay-endpoint tcp://HOST:PORT2]
                          [--topic T] [--start-seq 0] [--idle-seconds 2] -o LOG

FILE is a msgpack stream: concatenated ``KVEventBatch`` payloads (map or array
form, vLLM 0.33 or SGLang), or ``[seq, payload]`` / ``[topic, seq, payload]``
frame lists as a subscriber would save them.  An ENDPOINT (``tcp://``,
``ipc://``) is subscribed to until nothing arrives for ``--idle-seconds``
(sequence gaps are filled from the replay socket when one is given).

The log holds the prefix index the events describe (stores -> inserts,
removes -> evictions of one copy, clears -> resets); check it with
``kvstate replay LOG``.  Exit 0 on success, 2 on a usage or input error.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

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
    parser.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    parser.set_defaults(func=run)


def _subscribe(args: argparse.Namespace) -> list[Any]:
    from kvstate.vllm.zmq_events import KVEventSubscriber

    subscriber = KVEventSubscriber(args.source, args.replay_endpoint, args.topic,
                                   start_seq=args.start_seq)
    batches: list[Any] = []
    try:
        while args.max_batches is None or len(batches) < args.max_batches:
            received = subscriber.receive(args.idle_seconds)
            if not received:
                break
            batches.extend(item.batch for item in received)
    finally:
        subscriber.close()
    return batches[: args.max_batches] if args.max_batches is not None else batches


def run(args: argparse.Namespace) -> int:
    from kvstate.vllm.importer import BlockIndexImporter, read_capture
    from kvstate.vllm.kv_events import KVEventDecodeError

    source = args.source
    try:
        if source.startswith(("tcp://", "ipc://", "inproc://")):
            batches = _subscribe(args)
        else:
            with open(source, "rb") as handle:
                batches = read_capture(handle.read())
        importer = BlockIndexImporter(batches, medium=None if args.medium == "any" else args.medium)
    except (OSError, KVEventDecodeError, ValueError) as exc:
        print(f"kvstate import-events: {exc}", file=sys.stderr)
        return 2
    meta = {"front_end": "kvstate import-events", "source": source,
            "block_size": importer.stats.block_size}
    try:
        with Recorder(importer.engine, args.output, meta=meta):
            importer.run()
    except (OSError, ValueError) as exc:
        print(f"kvstate import-events: {exc}", file=sys.stderr)
        return 2
    counts = importer.stats.to_json()
    if args.json:
        print(json.dumps({"output": args.output, **counts}))
    else:
        print(f"wrote {args.output}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0
