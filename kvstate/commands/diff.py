"""``kvstate diff A B``: where two logs diverge.

Prints the first event index where the logs differ (with both events) and
the first state difference (the component and entry).  Exit 0 when the logs
hold the same events and states, 1 when they differ, 2 when a log is
malformed or missing.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvstate.log.diff import diff_logs, shorten
from kvstate.log.format import LogFormatError
from kvstate.log.reader import LogReader


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "diff", help="first divergence between two logs", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", metavar="A", help="first log")
    parser.add_argument("b", metavar="B", help="second log")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        with LogReader(args.a) as reader_a, LogReader(args.b) as reader_b:
            result = diff_logs(reader_a, reader_b)
    except OSError as exc:
        print(f"kvstate diff: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except LogFormatError as exc:
        if args.json:
            print(json.dumps({"ok": False, "error": {"kind": "format", "byte_offset": exc.offset,
                                                     "message": exc.reason}}))
        else:
            print(f"kvstate diff: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"ok": True, **result.to_json()}))
        return 0 if result.identical else 1
    if result.identical:
        print(f"identical: {result.events_a} events, same states throughout")
        return 0
    if result.event_index is None:
        print(f"same {result.events_a} events")
    else:
        print(f"first event divergence at event #{result.event_index}:")
        print(f"  A: {shorten(result.event_a, 200)}" if result.event_a is not None else "  A: (log ended)")
        print(f"  B: {shorten(result.event_b, 200)}" if result.event_b is not None else "  B: (log ended)")
    if result.state_index is None:
        print("states never differ")
    elif result.state_index < 0:
        print(f"initial states differ: {result.state_difference}")
    else:
        print(f"first state difference after event #{result.state_index}: {result.state_difference}")
    print(f"events: A {result.events_a}, B {result.events_b}")
    return 1
