"""The ``kvstate`` console command.

Each subcommand lives in its own module under ``kvstate.commands`` and exposes
``register(subparsers) -> None``; the parser it adds sets ``func`` (a callable
taking the parsed ``argparse.Namespace`` and returning an exit code).  This
module discovers and dispatches (modules whose name starts with ``_`` are
helpers, not commands), so adding a command never edits it, and it owns the
answers no command should have to give itself: ``--version``, the exit
status of a crash, an interrupt or a closed stdout (``EXIT_STATUS``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence

from kvstate import __version__, commands

EXIT_OK = 0
EXIT_FAILED = 1  # a violation, a refused event, a mismatch (and simulate's malformed trace)
EXIT_USAGE = 2  # malformed input, bad arguments, a file that cannot be read or written
EXIT_INTERNAL = 70  # EX_SOFTWARE (sysexits.h): a bug in kvstate
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
EXIT_CLOSED_STDOUT = 141  # 128 + SIGPIPE, as a shell reports a writer whose reader left

EXIT_STATUS = f"""\
exit status:
  {EXIT_OK:<4d}clean: nothing violated, mismatched or failed
  {EXIT_FAILED:<4d}an invariant violation, a refused event or a fingerprint mismatch (each command's
      help says what else; simulate: a malformed trace)
  {EXIT_USAGE:<4d}malformed input (a damaged log), bad arguments, or a file that cannot be read or written
  {EXIT_INTERNAL:<4d}internal error, a bug in kvstate: one line on stderr says where the traceback
      was written; --debug prints it instead
  {EXIT_INTERRUPTED:<4d}interrupted (Ctrl-C)
  {EXIT_CLOSED_STDOUT:<4d}stdout was closed early (for example by `| head`); nothing more is printed.
      replay, diff, verify and minimize finish their work and keep their verdict's status instead
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvstate",
        description="kvstate: an event-sourced, model-checked KV-cache manager.",
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kvstate {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="on an internal error print the traceback instead of writing it to a file")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if module_info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{module_info.name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the command; every outcome is an exit status (see ``EXIT_STATUS``)."""
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    prog = "kvstate"
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command:
            prog = f"kvstate {args.command}"
        if getattr(args, "func", None) is None:
            parser.print_help()
            return EXIT_USAGE
        code = int(args.func(args))
        sys.stdout.flush()  # a closed stdout must show up here, not at interpreter exit
        return code
    except BrokenPipeError:
        if not _stdout_is_gone():
            return _internal_error(prog, debug)
        _silence_stdout()
        return EXIT_CLOSED_STDOUT
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as error:
        if error.filename is None:
            return _internal_error(prog, debug)
        print(f"{prog}: {error.filename}: {error.strerror or error}", file=sys.stderr)
        return EXIT_USAGE
    except Exception:
        return _internal_error(prog, debug)


def _internal_error(prog: str, debug: bool) -> int:
    """One line naming the error and where its traceback is; the traceback itself with ``--debug``."""
    kind, error, _ = sys.exc_info()
    summary = f"{kind.__name__ if kind else 'error'}: {error}".splitlines()[0][:200]
    if debug:
        traceback.print_exc(file=sys.stderr)
        print(f"{prog}: internal error ({summary}); this is a bug in kvstate", file=sys.stderr)
        return EXIT_INTERNAL
    where = "rerun with --debug to see the traceback"
    try:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        handle, path = tempfile.mkstemp(prefix=f"kvstate-crash-{stamp}-", suffix=".txt")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(f"kvstate {__version__}, argv {sys.argv!r}\n")
            traceback.print_exc(file=out)
        where = f"traceback in {path} (or rerun with --debug)"
    except OSError:
        pass
    print(f"{prog}: internal error ({summary}); this is a bug in kvstate; {where}", file=sys.stderr)
    return EXIT_INTERNAL


def _stdout_is_gone() -> bool:
    """Whether stdout is a pipe whose reader has left (the BrokenPipeError was ours, not a worker's)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return True  # a replaced stdout (tests) cannot be probed: trust the error
    try:
        import select

        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(mask & select.POLLERR for _, mask in poller.poll(0))
    except (AttributeError, OSError):  # no poll() here: assume it was stdout
        return True


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush cannot raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, ValueError, OSError):
        pass


if __name__ == "__main__":  # pragma: no cover - exercised through the console script
    sys.exit(main())
