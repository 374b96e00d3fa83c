"""``kvstate verify LOG``: check a log's framing and digests without decoding an event.

Reads every frame (length bound, CRC, checkpoint and end counts) and
compares each checkpoint's and the end record's digest with a blake2b of the
bytes before it.  No event is decoded and no state is built: use ``kvstate
replay`` for fingerprints and invariants.  Exit 0 when every digest
matches, 1 when a checkpoint interval's bytes were altered (the interval is
named) or the log is format 1 and has no digests to check (with
``--require-digests``; otherwise 0 with a note), 2 when the log is
malformed, missing, or beyond the limits below.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from kvstate.log.format import LogFormatError
from kvstate.log.verify import verify_log
from kvstate.replay.options import add_limit_options, limits_from, say


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "verify", help="check a log's framing and digests without replaying it",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", metavar="LOG", help="log file")
    parser.add_argument("--require-digests", action="store_true",
                        help="exit 1 for a format 1 log, which has no digests")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_limit_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    try:
        found = verify_log(args.log, limits=limits_from(args))
    except OSError as exc:
        say(f"kvstate verify: {args.log}: {exc.strerror or exc}", sys.stderr)
        return 2
    except LogFormatError as exc:
        if args.json:
            say(json.dumps({"log": args.log, "ok": False,
                            "error": {"kind": "format", "byte_offset": exc.offset,
                                      "message": exc.reason}}))
        else:
            say(f"{args.log}: malformed log at byte {exc.offset}: {exc.reason}", sys.stderr)
        return 2
    seconds = time.perf_counter() - started
    broken = found.digest_failure
    code = 1 if broken is not None or (found.digests == "unverified" and args.require_digests) else 0
    if args.json:
        out: dict[str, Any] = {"log": args.log, "ok": code == 0, "format": found.format_version,
                               "bytes": found.bytes, "records": found.records,
                               "events": found.events, "checkpoints": found.checkpoints,
                               "digests": found.digests,
                               "digests_verified": found.digests_verified,
                               "seconds": round(seconds, 6)}
        if broken is not None:
            out["error"] = {"kind": "digest", "byte_offset": broken.offset,
                            "events": broken.events, "message": broken.describe()}
        say(json.dumps(out))
        return code
    rate = found.bytes / seconds / 1e6 if seconds > 0 else 0.0
    say(f"{args.log}: format {found.format_version}, {found.events} events, "
        f"{found.checkpoints} checkpoints, {found.bytes} bytes ({rate:,.0f} MB/s)")
    if broken is not None:
        say(f"FAILED: digest: {broken.describe()}", sys.stderr)
    elif found.digests == "unverified":
        say("  digests: could not be verified (a format 1 log has no digests); the framing "
            "and CRCs are sound")
    else:
        say(f"  digests: {found.digests_verified} verified; framing and CRCs sound")
    return code
