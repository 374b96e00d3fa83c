"""Counterexamples: print one event per line and write a replayable log.

Logs use the project's log format (``kvstate.log``: ``LogWriter`` / ``read_events``),
so ``kvstate`` log tools can replay and minimise them; the header's ``meta``
says which properties were violated, where the log came from, and the step
labels (planner commands) with their event counts.  Writing creates the
file's directory; nothing else is touched.
"""

from __future__ import annotations

import pathlib
from typing import Any

from kvstate.checking.explorer import Violation
from kvstate.events import Event, event_record
from kvstate.state import Geometry


def format_violation(violation: Violation) -> str:
    lines = [f"violated: {', '.join(violation.names)}"]
    lines += [f"  {message}" for message in violation.messages[:6]]
    lines.append(f"shortest path ({len(violation.events())} events):")
    for number, step in enumerate(violation.path, 1):
        if len(step.events) == 1 and step.label == type(step.events[0]).__name__:
            lines.append(f"{number:4d}  {event_record(step.events[0])}")
            continue
        lines.append(f"{number:4d}  # {step.label}")
        lines += [f"        {event_record(event)}" for event in step.events]
    return "\n".join(lines)


def write_log(path: str | pathlib.Path, geometry: Geometry, violation: Violation,
              origin: str = "explore", note: str = "", host_pages: int = 0,
              swa_pages: int = 0, mamba_slots: int = 0) -> pathlib.Path:
    steps = [[step.label, len(step.events)] for step in violation.path]
    return write_event_log(path, geometry, violation.events(), list(violation.names),
                           origin=origin, note=note, steps=steps, host_pages=host_pages,
                           swa_pages=swa_pages, mamba_slots=mamba_slots)


def write_event_log(path: str | pathlib.Path, geometry: Geometry, events: list[Event],
                    violation: list[str] | None, *, origin: str, note: str = "",
                    steps: list[Any] | None = None, host_pages: int = 0,
                    swa_pages: int = 0, mamba_slots: int = 0) -> pathlib.Path:
    """Write ``events`` as a replayable ``kvstate.log`` file (overwrites ``path``).

    The header's ``meta`` carries ``expect`` (the violated properties), ``origin``,
    ``note`` and ``steps``.  No end record is written when the last event is one
    the rules reject (the log then ends on the event to look at).
    """
    from kvstate.backends.persistent import apply_valid as apply
    from kvstate.errors import InvalidEvent
    from kvstate.log.writer import LogWriter, make_header
    from kvstate.state import initial_state

    target = pathlib.Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    meta = {"expect": {"violation": violation}, "origin": origin, "note": note,
            "steps": steps or []}
    state: Any = initial_state(geometry, host_pages=host_pages, swa_pages=swa_pages,
                               mamba_slots=mamba_slots)
    for event in events:
        try:
            state = apply(state, event)
        except InvalidEvent:
            state = None
            break
    header = make_header(geometry, checkpoint_every=0, meta=meta, host_pages=host_pages,
                         swa_pages=swa_pages, mamba_slots=mamba_slots)
    writer = LogWriter(target, header, fsync=False)
    writer.write_events(events)
    writer.close(state.fingerprint() if state is not None else None)
    return target


def read_log(path: str | pathlib.Path) -> tuple[Geometry, list[Event], dict[str, Any]]:
    """Geometry, events and header ``meta`` of a counterexample log."""
    from kvstate.log.reader import read_events

    header, events = read_events(path)
    return header.geometry, events, dict(header.meta)
