"""``python -m tools.explore``: the explorer from the repository root.

Same options as ``kvstate check``.
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
    args = parser.parse_args(["check", *args_list])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
