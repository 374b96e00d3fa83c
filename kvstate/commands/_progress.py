"""Progress reports on stderr for the long commands (check, simulate, replay, minimize).

Owned by the CLI (``kvstate.commands``; the leading underscore keeps
``kvstate.cli`` from taking it for a command).  The drawing is tqdm's: on a
terminal a live bar (count, rate, elapsed and, when the total is known, the
ETA), and with ``--progress`` on anything else a plain line every
``LINE_INTERVAL_S`` seconds plus a last one, formatted by tqdm's own
``format_meter`` so logs and CI output read the same as the bar.  Nothing is
shown without a terminal unless ``--progress`` is given, and ``--no-progress``
turns the bar off.

A ``Progress`` is fed absolute counts (``update(done, postfix)``) by the
loops' callbacks.  ``update`` is cheap when called far more often than it
draws (the explorer calls it once per expanded state): it only stores the
count until ``DRAW_INTERVAL_S`` has passed.
"""

from __future__ import annotations

import argparse
import sys
import time
from types import TracebackType
from typing import IO, Any, Literal

ProgressMode = Literal["bar", "lines", "off"]
DRAW_INTERVAL_S = 0.2
LINE_INTERVAL_S = 10.0
_LINE_KNOWN = ("{desc}: {percentage:3.0f}% {n_fmt}/{total_fmt} {unit} "
               "[{elapsed}<{remaining}, {rate_fmt}{postfix}]")
_LINE_OPEN = "{desc}: {n_fmt} {unit} [{elapsed}, {rate_fmt}{postfix}]"


def add_progress_option(parser: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--no-progress`` (default: a bar when stderr is a terminal)."""
    parser.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help="progress on stderr: a bar on a terminal, else a plain line every "
             f"{LINE_INTERVAL_S:.0f} s (default: only on a terminal)")


def progress_mode(flag: bool | None, stream: IO[str] | None = None) -> ProgressMode:
    """What ``--progress`` (``None`` when not given) means for ``stream`` (stderr by default)."""
    if flag is False:
        return "off"
    target = sys.stderr if stream is None else stream
    try:
        tty = target.isatty()
    except (AttributeError, ValueError):  # a closed or file-like replacement stream
        tty = False
    if tty:
        return "bar"
    return "lines" if flag else "off"


class Progress:
    """One task's progress: ``label``, a count of ``unit`` out of ``total`` (``None``: unknown).

    Use as a context manager, or call ``close``; a closed or ``"off"``
    ``Progress`` ignores updates.  ``unit_scale`` prints large counts as
    ``4.77M`` (bytes use ``unit="B"``, scaled by 1024).
    """

    def __init__(self, label: str, *, total: float | None, unit: str, mode: ProgressMode,
                 unit_scale: bool = False, stream: IO[str] | None = None,
                 line_interval_s: float = LINE_INTERVAL_S) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.mode = mode
        self.unit_scale = unit_scale
        self.stream = sys.stderr if stream is None else stream
        self.line_interval_s = line_interval_s
        self.done: float = 0
        self.postfix = ""
        self.started = time.monotonic()
        self._last_draw = self._last_line = self.started
        self._bar: Any = None
        if mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label, unit=unit, unit_scale=unit_scale,
                             unit_divisor=1024 if unit == "B" else 1000, file=self.stream,
                             leave=False, dynamic_ncols=True, mininterval=DRAW_INTERVAL_S)

    def update(self, done: float, postfix: str = "") -> None:
        """Record ``done`` units so far (and a short ``postfix``); draw when it is time."""
        if self.mode == "off":
            return
        self.done, self.postfix = done, postfix
        now = time.monotonic()
        if now - self._last_draw < DRAW_INTERVAL_S:
            return
        self._last_draw = now
        if self._bar is not None:
            self._draw_bar()
        elif now - self._last_line >= self.line_interval_s:
            self._last_line = now
            self._write_line()

    def _draw_bar(self) -> None:
        bar = self._bar
        if self.postfix:
            bar.set_postfix_str(self.postfix, refresh=False)
        bar.update(self.done - bar.n)

    def line(self) -> str:
        """The current state as one plain line (what ``--progress`` prints off a terminal)."""
        from tqdm import tqdm

        known = self.total is not None and self.total > 0
        return str(tqdm.format_meter(
            self.done, self.total if known else None, time.monotonic() - self.started,
            prefix=self.label, unit=self.unit, unit_scale=self.unit_scale,
            unit_divisor=1024 if self.unit == "B" else 1000,
            postfix=self.postfix or None, bar_format=_LINE_KNOWN if known else _LINE_OPEN))

    def _write_line(self) -> None:
        self.stream.write(self.line() + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Erase the bar (the command's own output follows), or print the last plain line."""
        if self.mode == "off":
            return
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        else:
            self._write_line()
        self.mode = "off"

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
