"""The ``kvstate`` console command.

Each subcommand lives in its own module under ``kvstate.commands`` and exposes
``register(subparsers) -> None``; the parser it adds sets ``func`` (a callable
taking the parsed ``argparse.Namespace`` and returning an exit code).  This
module only discovers and dispatches, so adding a command never edits it.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from kvstate import commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvstate",
        description="kvstate: an event-sourced, model-checked KV-cache manager.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{module_info.name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover - exercised through the console script
    sys.exit(main())
