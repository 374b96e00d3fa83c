"""Bounds on trace input, and the reading helpers that enforce them.

Owned by ``kvstate.traces``; every reader goes through these helpers, so a
trace file (untrusted input) can only ever produce ``TraceRequest`` values or
a ``TraceFormatError`` naming the file and line, never a traceback, a hang or
an unbounded allocation.  Each bound is far above any real trace we know of
(the largest values seen in the shipped traces are given for scale):

=====================  ====================  =========================================
bound                  value                 why
=====================  ====================  =========================================
``MAX_LINE_BYTES``     16 MiB per line       JSONL / CSV lines are read with a length
                                             limit (longest Mooncake line: 2 KB)
``MAX_DOCUMENT_BYTES`` 256 MiB per document  one kv-cache-tester conversation is held
                                             in memory (largest shipped: 4.2 MB)
``MAX_REQUEST_TOKENS`` 2**24 tokens          prompt plus output of one request; the
                                             synthetic private ids give each request
                                             2**24 offsets (largest prompt seen: 894k)
``MAX_ARRIVAL_S``      1e10 s                arrival times stay finite floats
``MAX_SUBAGENT_DEPTH`` 16                    kv-cache-tester subagents (real: 1)
``MAX_BLOCK_SIZE``     65,536 tokens         hash-block size (real: 64 and 512)
``MAX_TOKEN_ID``       2**63 - 1             synthetic token ids must fit a signed
                                             64-bit integer (logs, torch tensors), which
                                             bounds hash ids (``max_hash_id``)
=====================  ====================  =========================================

JSON must be UTF-8 (a leading byte-order mark is allowed); nesting deeper
than Python's recursion limit and integers longer than its 4300-digit
conversion limit are reported, with their line, as malformed input.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvstate.traces.records import TraceFormatError

MAX_LINE_BYTES = 1 << 24
MAX_DOCUMENT_BYTES = 1 << 28
MAX_REQUEST_TOKENS = 1 << 24
MAX_ARRIVAL_S = 10**10
MAX_SUBAGENT_DEPTH = 16
MAX_BLOCK_SIZE = 1 << 16
MAX_TOKEN_ID = (1 << 63) - 1

_LONG_NUMBER = re.compile(r"[0-9]{4301,}")  # longer than Python's default int conversion limit
_SHOWN = 48


def short(value: Any) -> str:
    """``repr(value)``, cut to a few dozen characters so one bad field makes a one-line error."""
    text = repr(value)
    if len(text) <= _SHOWN:
        return text
    return f"{text[:_SHOWN]}... ({len(text)} characters)"


def max_hash_id(block_size: int) -> int:
    """The largest block key whose synthetic token ids (``traces.tokens``) fit ``MAX_TOKEN_ID``.

    The partial-block formula ``((key * B + count) * B + offset) << 2`` is the
    largest of the three families, so it sets the bound.
    """
    return (MAX_TOKEN_ID >> 2) // (block_size * block_size) - 1


def length_problem(prompt: int, output: int) -> str | None:
    """Why a request of ``prompt`` + ``output`` tokens is refused, or ``None`` when it fits."""
    if prompt + output > MAX_REQUEST_TOKENS:
        return (f"prompt plus output is {prompt + output} tokens; a request may hold at most "
                f"{MAX_REQUEST_TOKENS}")
    return None


def read_lines(path: str | Path, name: str) -> Iterator[tuple[int, str]]:
    """Yield ``(1-based line number, text)`` for each line of ``path``, decoded as UTF-8.

    Reads one line at a time, at most ``MAX_LINE_BYTES`` of it; an over-long
    line or bytes that are not UTF-8 raise ``TraceFormatError`` with the line.
    A byte-order mark at the start of the file is dropped.
    """
    with open(path, "rb") as handle:
        line_number = 0
        while True:
            raw = handle.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            line_number += 1
            if len(raw) > MAX_LINE_BYTES:
                raise TraceFormatError(name, line_number, f"line is longer than {MAX_LINE_BYTES} bytes")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise TraceFormatError(
                    name, line_number, f"not UTF-8 (byte {error.start + 1} of the line: {error.reason})"
                ) from None
            if line_number == 1:
                text = text.removeprefix("\ufeff")
            yield line_number, text


def decode_document(raw: bytes, name: str) -> str:
    """A whole JSON document as text; bytes that are not UTF-8 raise with their line."""
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise TraceFormatError(name, None, f"document is larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise TraceFormatError(name, line, f"not UTF-8 ({error.reason})") from None


def parse_json(text: str, name: str, first_line: int = 1) -> Any:
    """``json.loads(text)``, with every failure a ``TraceFormatError`` at its line.

    ``first_line`` is the file line ``text`` starts on.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise TraceFormatError(
            name, first_line + error.lineno - 1, f"invalid JSON at column {error.colno}: {error.msg}"
        ) from None
    except RecursionError:
        line = first_line + text.count("\n", 0, _too_deep_at(text)) if "\n" in text else first_line
        raise TraceFormatError(name, line, "JSON nested too deeply") from None
    except ValueError:  # Python refuses to convert an integer of more than 4300 digits
        found = _LONG_NUMBER.search(text)
        line = first_line + (text.count("\n", 0, found.start()) if found else 0)
        digits = len(found.group()) if found else "thousands of"
        raise TraceFormatError(name, line, f"number too long ({digits} digits)") from None


def _too_deep_at(text: str, depth_limit: int = 500) -> int:
    """Index where bracket nesting (outside strings) first passes ``depth_limit``; error path only."""
    depth = 0
    in_string = escaped = False
    for index, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > depth_limit:
                return index
        elif char in "]}":
            depth -= 1
    return len(text)
