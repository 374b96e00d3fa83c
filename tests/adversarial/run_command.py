"""Run one log command (replay, diff, minimize, verify) and record its peak memory.

``python run_command.py RSS_FILE COMMAND ARGS...``: builds a parser with only
the log commands (so the baseline is not the whole CLI's imports), notes the
process's peak RSS after the imports, runs the command, and writes
``before after exit_code`` (KiB, KiB, int) to RSS_FILE.  The tests compare
the two peaks to bound what one hostile log costs.  Commands missing from an
older kvstate (``verify``) exit 3.
"""

from __future__ import annotations

import argparse
import importlib
import resource
import sys


def main(argv: list[str]) -> int:
    rss_file, command, *rest = argv
    parser = argparse.ArgumentParser(prog="kvstate")
    subparsers = parser.add_subparsers(dest="command")
    try:
        module = importlib.import_module(f"kvstate.commands.{command}")
    except ImportError:
        return 3
    module.register(subparsers)
    args = parser.parse_args([command, *rest])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code = 99
    try:
        code = int(args.func(args))
    finally:
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with open(rss_file, "w", encoding="utf-8") as out:
            out.write(f"{before} {after} {code}\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
