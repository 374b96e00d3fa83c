"""``kvstate minimize LOG -o OUT``: shrink a failing log, keeping the same failure.

Delta debugging drops whole request lifecycles, chunks and single events,
keeping only candidates that fail with the same kind and check; the result
is a valid log that ``kvstate replay`` fails the same way.  Exit 0 when OUT
was written, 1 when LOG does not fail (nothing to minimize), 2 when LOG is
malformed, missing, or declares a geometry beyond the limits below.
Progress (candidate replays out of --max-tests, the events left) is shown
on a terminal, and as a plain line every few seconds with --progress
elsewhere; its ETA is an upper bound, as the search usually stops well
before --max-tests.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvstate.commands._progress import Progress, add_progress_option, progress_mode
from kvstate.log.format import LogFormatError
from kvstate.replay.minimize import NoFailure, minimize_file
from kvstate.replay.options import add_limit_options, limits_from, say


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "minimize", help="shrink a failing log to the events that matter", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", metavar="LOG", help="a log that fails under kvstate replay")
    parser.add_argument("-o", "--output", required=True, metavar="OUT", help="where to write")
    parser.add_argument("--max-tests", type=int, default=20000, metavar="N",
                        help="stop after N candidate replays (default 20000)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_limit_options(parser)
    add_progress_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    bar = Progress("minimize", total=args.max_tests, unit="replays", mode=progress_mode(args.progress))

    def advance(tests: int, events: int) -> None:
        bar.update(tests, f"{events:,} events left")

    try:
        with bar:
            result = minimize_file(args.log, args.output, max_tests=args.max_tests,
                                   limits=limits_from(args),
                                   progress=advance if bar.mode != "off" else None)
            advance(result.tests_run, len(result.events))
    except OSError as exc:
        say(f"kvstate minimize: {exc.filename}: {exc.strerror or exc}", sys.stderr)
        return 2
    except LogFormatError as exc:
        say(f"kvstate minimize: {exc}", sys.stderr)
        return 2
    except NoFailure as exc:
        say(f"kvstate minimize: {args.log}: {exc}", sys.stderr)
        return 1
    if args.json:
        say(json.dumps({"ok": True, "output": args.output, "events": len(result.events),
                          "original_events": result.original_events, "tests": result.tests_run,
                          "failure": {"kind": result.signature.kind,
                                      "check": result.signature.check}}))
    else:
        say(f"{args.log}: {result.original_events} -> {len(result.events)} events "
              f"({result.tests_run} candidate replays), still failing with {result.signature}; "
              f"wrote {args.output}")
    return 0
