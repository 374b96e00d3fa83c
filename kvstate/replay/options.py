"""Command-line pieces shared by ``kvstate replay``, ``diff``, ``minimize`` and ``verify``.

The geometry limits a reader enforces (``--max-pages``, ``--max-rows``,
``--max-host-pages``; ``kvstate.log.limits``) and ``say``, which prints
without a ``BrokenPipeError`` traceback when the reader of our output
(``| head``) goes away: the rest of the output is dropped and the command
still returns its own exit code.  Owned by the replay tools; the command
modules are in ``kvstate.commands``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import IO

from kvstate.log.limits import DEFAULT_LIMITS, Limits


def add_limit_options(parser: argparse.ArgumentParser) -> None:
    """``--max-pages``, ``--max-rows``, ``--max-host-pages`` (exit 2 past them)."""
    group = parser.add_argument_group("limits on what a log header may declare (exit 2 past them)")
    group.add_argument("--max-pages", type=_positive, default=DEFAULT_LIMITS.max_pages, metavar="N",
                       help=f"device pages (default {DEFAULT_LIMITS.max_pages})")
    group.add_argument("--max-rows", type=_positive, default=DEFAULT_LIMITS.max_rows, metavar="N",
                       help=f"request rows (default {DEFAULT_LIMITS.max_rows})")
    group.add_argument("--max-host-pages", type=_positive, default=DEFAULT_LIMITS.max_host_pages,
                       metavar="N", help=f"host-tier pages (default {DEFAULT_LIMITS.max_host_pages})")


def limits_from(args: argparse.Namespace) -> Limits:
    return Limits(max_pages=args.max_pages, max_rows=args.max_rows,
                  max_host_pages=args.max_host_pages)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an int") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def say(text: str, file: IO[str] | None = None) -> None:
    """``print(text)``, quietly dropping it once the pipe we write to is closed."""
    out = sys.stdout if file is None else file
    try:
        print(text, file=out)
        out.flush()
    except BrokenPipeError:
        # Point the descriptor at /dev/null so the interpreter's final flush does not
        # raise again; the caller carries on and returns its exit code.
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, out.fileno())
        finally:
            os.close(devnull)
