"""``kvstate diff A B``: where two logs diverge.

Prints the first event index where the logs differ, the differing element
(``Allocate.pages[3]: 7 in A, 9 in B``) and both events cut around it, and
the first state difference (the component and entry).  Exit 0 when the
logs hold the same events and states, 1 when they differ, 2 when a log is
malformed, missing, or declares a geometry beyond the limits below.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvstate.log.format import LogFormatError
from kvstate.log.reader import LogReader
from kvstate.replay.diff import diff_logs, focus
from kvstate.replay.options import add_limit_options, limits_from, say


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "diff", help="first divergence between two logs", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", metavar="A", help="first log")
    parser.add_argument("b", metavar="B", help="second log")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_limit_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    limits = limits_from(args)
    try:
        with LogReader(args.a, limits=limits) as reader_a, \
                LogReader(args.b, limits=limits) as reader_b:
            result = diff_logs(reader_a, reader_b)
    except OSError as exc:
        say(f"kvstate diff: {exc.filename}: {exc.strerror or exc}", sys.stderr)
        return 2
    except LogFormatError as exc:
        if args.json:
            say(json.dumps({"ok": False, "error": {"kind": "format", "byte_offset": exc.offset,
                                                   "message": exc.reason}}))
        else:
            say(f"kvstate diff: {exc}", sys.stderr)
        return 2
    if args.json:
        say(json.dumps({"ok": True, **result.to_json()}))
        return 0 if result.identical else 1
    if result.identical:
        say(f"identical: {result.events_a} events, same states throughout")
        return 0
    if result.event_index is None:
        say(f"same {result.events_a} events")
    else:
        say(f"first event divergence at event #{result.event_index}:")
        if result.event_a is not None and result.event_b is not None:
            shown_a, shown_b = focus(result.event_a, result.event_b)
            say(f"  differs at {result.event_difference}")
        else:
            shown_a = "(log ended)" if result.event_a is None else focus(result.event_a, "")[0]
            shown_b = "(log ended)" if result.event_b is None else focus(result.event_b, "")[0]
        say(f"  A: {shown_a}")
        say(f"  B: {shown_b}")
    if result.state_index is None:
        say("states never differ")
    elif result.state_index < 0:
        say(f"initial states differ: {result.state_difference}")
    else:
        say(f"first state difference after event #{result.state_index}: {result.state_difference}")
    say(f"events: A {result.events_a}, B {result.events_b}")
    return 1
