"""``kvstate record``: drive a seeded workload through the SGLang front end into a log.

    kvstate record --workload synthetic --requests N --seed S [--page-size P]
                   [--capacity TOKENS] -o LOG

The same arguments always record the same log, and a recording of any
length runs in flat memory.  A log of a real request trace comes from
``kvstate simulate TRACE --record LOG`` (the planner and the rules, one trace
block per page).  Exit 0 on success, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvstate.log.format import DEFAULT_CHECKPOINT_EVERY


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "record", help="record a generated workload into a log", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=("synthetic",), default="synthetic",
                        help="workload generator: seeded chat-like requests through the SGLang "
                             "front end (to record a real trace: kvstate simulate TRACE --record LOG)")
    parser.add_argument("--requests", type=int, default=50, metavar="N")
    parser.add_argument("--seed", type=int, default=0, metavar="S")
    parser.add_argument("--page-size", type=int, default=1, metavar="P")
    parser.add_argument("--capacity", type=int, default=1024, metavar="TOKENS",
                        help="KV pool size in tokens (default 1024)")
    parser.add_argument("--max-running", type=int, default=8, metavar="R",
                        help="request rows, i.e. the most requests running at once (default 8)")
    parser.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                        help="checkpoint interval in events (default: by pool size, at least "
                             f"{DEFAULT_CHECKPOINT_EVERY})")
    parser.add_argument("-o", "--output", required=True, metavar="LOG")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: the SGLang front end pulls in torch, which every other command can skip.
    from kvstate.log.recorder import Recorder
    from kvstate.workloads.synthetic import SyntheticRun, WorkloadSpec, run_synthetic

    try:
        spec = WorkloadSpec(requests=args.requests, seed=args.seed, page_size=args.page_size,
                            capacity=args.capacity, max_running=args.max_running)
    except ValueError as exc:
        print(f"kvstate record: {exc}", file=sys.stderr)
        return 2
    if args.checkpoint_every is not None and args.checkpoint_every < 0:
        print("kvstate record: --checkpoint-every must be >= 0", file=sys.stderr)
        return 2
    meta = {"workload": args.workload, "requests": spec.requests, "seed": spec.seed,
            "page_size": spec.page_size, "capacity": spec.capacity,
            "max_running": spec.max_running, "front_end": "kvstate.sglang"}
    recorders: list[Recorder] = []

    def attach(run: SyntheticRun) -> None:
        recorders.append(Recorder(run.engine, args.output, checkpoint_every=args.checkpoint_every,
                                  meta=meta))

    try:
        result = run_synthetic(spec, attach=attach, keep_events=False)
    except OSError as exc:
        print(f"kvstate record: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    recorder = recorders[0]
    recorder.close()
    fingerprint = result.engine.state.fingerprint().hex()
    if args.json:
        print(json.dumps({"log": args.output, "events": recorder.count, "requests": result.finished,
                          "retracted": result.retracted, "dropped": result.dropped,
                          "final_fingerprint": fingerprint, "ok": True}))
    else:
        print(f"recorded {recorder.count} events of {result.finished} requests "
              f"({result.retracted} finished early on OOM, {result.dropped} dropped) to {args.output} "
              f"({spec.capacity // spec.page_size} pages of {spec.page_size} tokens); "
              f"final fingerprint {fingerprint}")
    return 0
