"""Counterexamples: print one event per line and write a replayable msgpack log.

The log is a msgpack map (the layout of ``../shared/reference/style_and_checking.md``
section 3.6): ``format``, ``version``, ``geometry``, ``events`` (each
``encode_event`` record), ``steps`` (labels with their event counts),
``expect`` (the violated properties) and ``origin``.  ``replay_log`` reads
one back and re-runs it through the reducer.  Writing creates the file's
directory; nothing else is touched.
"""

from __future__ import annotations

import pathlib
from typing import Any

import msgpack

from kvstate.checking.explorer import Violation
from kvstate.events import Event, decode_event, encode_event
from kvstate.state import Geometry

LOG_FORMAT = "kvstate.log"
LOG_VERSION = 1


def format_violation(violation: Violation) -> str:
    lines = [f"violated: {', '.join(violation.names)}"]
    lines += [f"  {message}" for message in violation.messages[:6]]
    lines.append(f"shortest path ({len(violation.events())} events):")
    for number, step in enumerate(violation.path, 1):
        if len(step.events) == 1 and step.label == type(step.events[0]).__name__:
            lines.append(f"{number:4d}  {encode_event(step.events[0])}")
            continue
        lines.append(f"{number:4d}  # {step.label}")
        lines += [f"        {encode_event(event)}" for event in step.events]
    return "\n".join(lines)


def write_log(path: str | pathlib.Path, geometry: Geometry, violation: Violation,
              origin: str = "explore", note: str = "") -> pathlib.Path:
    target = pathlib.Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "format": LOG_FORMAT, "version": LOG_VERSION,
        "geometry": [geometry.num_pages, geometry.page_size, geometry.num_rows, geometry.row_width],
        "events": [encode_event(event) for event in violation.events()],
        "steps": [[step.label, len(step.events)] for step in violation.path],
        "expect": {"violation": list(violation.names)},
        "origin": origin, "note": note,
    }
    target.write_bytes(msgpack.packb(record, use_bin_type=True))
    return target


def read_log(path: str | pathlib.Path) -> tuple[Geometry, list[Event], dict[str, Any]]:
    record = msgpack.unpackb(pathlib.Path(path).read_bytes(), raw=False)
    if record.get("format") != LOG_FORMAT:
        raise ValueError(f"{path} is not a {LOG_FORMAT} file")
    num_pages, page_size, num_rows, row_width = record["geometry"]
    geometry = Geometry(num_pages, page_size, num_rows, row_width)
    return geometry, [decode_event(e) for e in record["events"]], record
