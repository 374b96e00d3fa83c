"""Event logs: a versioned, framed msgpack format, a recorder, a streaming reader, replay.

``Recorder`` attaches to an engine (or a front end object) and writes every
applied event; ``LogReader`` streams a log back in constant memory and raises
``LogFormatError`` (byte offset + reason) for any malformed input; ``replay``
re-applies the events with the pure reducer and checks invariants and
fingerprints.  ``minimize`` shrinks a failing log; ``diff`` compares two.
The byte layout is documented in docs/log-format.md.
"""

from kvstate.log.diff import LogDiff, diff_logs
from kvstate.log.format import (
    FORMAT_VERSION,
    MAGIC,
    Checkpoint,
    EndRecord,
    LogFormatError,
    LogHeader,
    auto_checkpoint_every,
)
from kvstate.log.minimize import MinimizeResult, NoFailure, minimize_events, minimize_file
from kvstate.log.reader import LogReader, read_events, read_header
from kvstate.log.recorder import Recorder
from kvstate.log.replay import ReplayFailure, ReplayResult, Summary, replay, replay_path
from kvstate.log.upcast import UPCASTERS, upcaster
from kvstate.log.writer import LogWriter, make_header, write_log

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "UPCASTERS",
    "Checkpoint",
    "EndRecord",
    "LogDiff",
    "LogFormatError",
    "LogHeader",
    "LogReader",
    "LogWriter",
    "MinimizeResult",
    "NoFailure",
    "Recorder",
    "ReplayFailure",
    "ReplayResult",
    "Summary",
    "auto_checkpoint_every",
    "diff_logs",
    "make_header",
    "minimize_events",
    "minimize_file",
    "read_events",
    "read_header",
    "replay",
    "replay_path",
    "upcaster",
    "write_log",
]
