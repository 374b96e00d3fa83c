"""Instructions per operation, counted by valgrind: A/B comparisons that a noisy machine
cannot blur.

    python tools/count_instructions.py [--root DIR ...] [--workload NAME ...] [--log FILE ...]

On a shared VM, timings of the same code move by 30-50 % from one minute to
the next, which hides a 5 % change.  The number of instructions the CPU
retires does not move: this tool runs each workload under
``valgrind --tool=callgrind`` twice, with ``low`` and ``high`` repetitions, and
reports ``(count(high) - count(low)) / (high - low)``, the instructions of one
repetition with the interpreter's start-up and the imports cancelled out.
Instructions are not time (a cache miss costs more than an add), so a gain
found here is confirmed by the timing benchmarks (``bench_vllm.py``,
``bench_log.py``) before it is reported; what this tool gives is a stable
sign and size for a change.

Workloads (each repetition):

* ``alloc_free16``, ``alloc_free1024``: ``BlockPool.get_new_blocks(k)`` then
  ``free_blocks`` on a 100,000-block pool with KV events on (vLLM's front end);
* ``touch1024``: ``touch`` of 1,024 cached free blocks, then their free;
* ``rules:LOG``: every event of ``LOG`` applied to a fresh live state (the rules
  alone, events already decoded);
* ``replay:LOG``: ``replay_path(LOG, check_every=0)`` (reader, codec, rules,
  summary, final fingerprint).

``--log`` adds the ``rules:`` and ``replay:`` workloads of a log (for example
the ones ``bench_log.py --workdir DIR`` writes).  ``--root`` names source
trees to import kvstate from (default: this checkout); give two to compare
a change with the code before it (``git worktree add DIR REV``).  String
hashing is seeded (``PYTHONHASHSEED=0``) so that dict layouts, and with them
the counts, repeat exactly.  Needs valgrind; not part of CI.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
POOL_WORKLOADS = {"alloc_free16": (100, 600), "alloc_free1024": (5, 25), "touch1024": (5, 25)}
LOG_REPETITIONS = (1, 3)

# The child program: one workload, ``n`` repetitions (argv: workload, n).
CHILD = r'''
import sys
kind, n = sys.argv[1], int(sys.argv[2])
if kind.startswith(("rules:", "replay:")):
    mode, path = kind.split(":", 1)
    if mode == "replay":
        from kvstate.replay.run import replay_path
        for _ in range(n):
            assert replay_path(path, check_every=0).ok
    else:
        from kvstate.backends.live import LiveState
        from kvstate.log.format import Checkpoint, EndRecord
        from kvstate.log.reader import LogReader
        from kvstate.replay.run import start_state
        with LogReader(path) as reader:
            header = reader.header
            events = [item for _, item in reader.records()
                      if not isinstance(item, (Checkpoint, EndRecord))]
        initial = start_state(header)
        for _ in range(n):
            live = LiveState.thaw(initial)
            for event in events:
                live.apply(event)
else:
    from kvstate.vllm.block_pool import BlockPool
    from kvstate.vllm.request import Request
    pool = BlockPool(100_000, True, 16, enable_kv_cache_events=True, hash_seed="0",
                     keep_events=False)
    if kind == "touch1024":
        request = Request("r", list(range(1024 * 16)), 16, hash_seed="0")
        blocks = pool.get_new_blocks(1024)
        pool.cache_full_blocks(request, blocks, 0, 1024, 16, 0)
        newest_first = list(reversed(blocks))
        pool.free_blocks(newest_first)
        for _ in range(n):
            pool.touch(blocks)
            pool.free_blocks(newest_first)
    else:
        count = int(kind.removeprefix("alloc_free"))
        for _ in range(n):
            pool.free_blocks(pool.get_new_blocks(count))
'''


def count(root: Path, workload: str, repetitions: int) -> int:
    """Instructions of the whole child run (valgrind's ``Collected`` total)."""
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONHASHSEED="0")
    # Run in ``root``: ``python -c`` puts the working directory first on the path.
    run = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         sys.executable, "-c", CHILD, workload, str(repetitions)],
        env=env, cwd=root, capture_output=True, text=True, check=False)
    found = re.search(r"Collected\s*:\s*([\d,]+)", run.stderr)
    if run.returncode or found is None:
        raise SystemExit(f"{workload} under {root} failed:\n{run.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def per_repetition(root: Path, workload: str) -> float:
    low, high = POOL_WORKLOADS.get(workload, LOG_REPETITIONS)
    return (count(root, workload, high) - count(root, workload, low)) / (high - low)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", action="append", type=Path,
                        help="a kvstate source tree (repeatable; default: this checkout)")
    parser.add_argument("--workload", action="append", choices=sorted(POOL_WORKLOADS),
                        help="a pool workload (repeatable; default: all, unless --log is given)")
    parser.add_argument("--log", action="append", type=Path, default=[],
                        help="a log whose rules and replay are counted (repeatable)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed; this tool needs it", file=sys.stderr)
        return 2
    roots = [root.resolve() for root in (args.root or [REPO])]
    workloads = list(args.workload or ([] if args.log else sorted(POOL_WORKLOADS)))
    for log in args.log:
        if not log.is_file():
            parser.error(f"no such log: {log}")
        workloads += [f"rules:{log.resolve()}", f"replay:{log.resolve()}"]
    print("| workload | " + " | ".join(str(root) for root in roots) + " |")
    print("|---|" + "---:|" * len(roots))
    for workload in workloads:
        counts = [per_repetition(root, workload) for root in roots]
        shown = [f"{counts[0]:,.0f}"] + [f"{value:,.0f} ({value / counts[0]:.3f}x)"
                                         for value in counts[1:]]
        name = workload if ":" not in workload else \
            f"{workload.split(':', 1)[0]}:{Path(workload.split(':', 1)[1]).name}"
        print(f"| {name} | " + " | ".join(shown) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
