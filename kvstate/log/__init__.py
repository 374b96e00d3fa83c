"""The log format: a versioned, framed msgpack file of events, and how to write and read it.

``Recorder`` attaches to an engine (or a front end object) and writes every
committed event; ``LogWriter`` writes records; ``LogReader`` streams a log
back in constant memory and raises ``LogFormatError`` (byte offset + reason)
for any malformed input.  Events are encoded and validated by
``kvstate.events.codec``.  The tools built on logs (replay, diff, minimize)
are in ``kvstate.replay``.  The byte layout is documented in docs/log-format.md.
"""

from kvstate.events.codec import UPCASTERS, upcaster
from kvstate.log.format import (
    FORMAT_VERSION,
    MAGIC,
    Checkpoint,
    EndRecord,
    LogFormatError,
    LogHeader,
    auto_checkpoint_every,
)
from kvstate.log.reader import LogReader, read_events, read_header
from kvstate.log.recorder import Recorder, engine_of
from kvstate.log.writer import LogWriter, make_header, write_log

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "UPCASTERS",
    "Checkpoint",
    "EndRecord",
    "LogFormatError",
    "LogHeader",
    "LogReader",
    "LogWriter",
    "Recorder",
    "auto_checkpoint_every",
    "engine_of",
    "make_header",
    "read_events",
    "read_header",
    "upcaster",
    "write_log",
]
