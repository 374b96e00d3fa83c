"""The log format: a versioned, framed msgpack file of events, and how to write, read and verify it.

``Recorder`` attaches to an engine (or a front end object) and writes every
committed event; ``LogWriter`` writes records; ``LogReader`` streams a log
back in constant memory and raises ``LogFormatError`` (byte offset + reason)
for any malformed input, ``LogLimitError`` for a header beyond its
``Limits``; ``verify_log`` checks framing and digests without decoding an
event.  Events are encoded and validated by ``kvstate.events.codec``.  The
tools built on logs (replay, diff, minimize) are in ``kvstate.replay``.
The byte layout is documented in docs/log-format.md.
"""

from kvstate.events.codec import UPCASTERS, upcaster
from kvstate.log.digest import DigestBreak
from kvstate.log.format import (
    FORMAT_VERSION,
    MAGIC,
    Checkpoint,
    EndRecord,
    LogFormatError,
    LogHeader,
    LogLimitError,
    auto_checkpoint_every,
)
from kvstate.log.limits import DEFAULT_LIMITS, TOKENS_PER_SLOT, Limits
from kvstate.log.reader import LogReader, read_events, read_header
from kvstate.log.recorder import Recorder, engine_of
from kvstate.log.verify import Verified, verify_log
from kvstate.log.writer import LogWriter, make_header, write_log

__all__ = [
    "DEFAULT_LIMITS",
    "FORMAT_VERSION",
    "MAGIC",
    "TOKENS_PER_SLOT",
    "UPCASTERS",
    "Checkpoint",
    "DigestBreak",
    "EndRecord",
    "Limits",
    "LogFormatError",
    "LogHeader",
    "LogLimitError",
    "LogReader",
    "LogWriter",
    "Recorder",
    "Verified",
    "auto_checkpoint_every",
    "engine_of",
    "make_header",
    "read_events",
    "read_header",
    "upcaster",
    "verify_log",
    "write_log",
]
