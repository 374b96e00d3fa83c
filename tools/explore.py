"""``python -m tools.explore``: the explorer from the repository root.

Same options as ``kvstate check``; additionally ``--proposed-fixes`` runs the
search with the reducer fixes proposed in ``tests/spec_fixes.py`` installed
(for findings not yet fixed in the core).
"""

from __future__ import annotations

import argparse
import sys

from kvstate.commands import check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.explore")
    sub = parser.add_subparsers(dest="command")
    check.register(sub)
    args_list = list(sys.argv[1:] if argv is None else argv)
    fixes = "--proposed-fixes" in args_list
    if fixes:
        args_list.remove("--proposed-fixes")
        from tests.spec_fixes import install

        install()
    args = parser.parse_args(["check", *args_list])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
