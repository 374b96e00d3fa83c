"""Streaming reader for the Azure LLM inference trace 2023 CSVs.

Columns: ``TIMESTAMP,ContextTokens,GeneratedTokens`` with timestamps such as
``2023-11-16 18:17:03.9799600`` (seven fractional digits).  The trace has no
prefix information, so every prompt gets private token ids: no two requests
share a token.  Arrival times are seconds since the first row.  Rows are
yielded in file order, one line read at a time (each parsed on its own: the
format has no quoted newlines); a malformed row, or one past the bounds of
``kvstate.traces.limits``, raises ``TraceFormatError`` naming the file and line.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from datetime import date
from pathlib import Path

from kvstate.traces.limits import MAX_REQUEST_TOKENS, length_problem, read_lines, short
from kvstate.traces.records import TraceFormatError, TraceRequest
from kvstate.traces.tokens import private_tokens

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_SECONDS_PER_DAY = 86_400
# Plain ASCII digits only: int() would also take "3_74" or full-width digits.
_INTEGER = re.compile(r"-?[0-9]+")


def parse_azure_timestamp(text: str) -> tuple[int, float]:
    """``(day ordinal, seconds into the day)`` for ``YYYY-MM-DD HH:MM:SS[.fraction]``.

    Any fraction length is accepted; the day and the clock are kept apart so
    differences stay exact to the microsecond.
    """
    day_text, _, clock_text = text.strip().partition(" ")
    hours, minutes, seconds = clock_text.split(":")
    hour, minute, second = int(hours), int(minutes), float(seconds)
    if not (0 <= hour < 24 and 0 <= minute < 60 and 0 <= second < 61):
        raise ValueError(f"clock out of range: {clock_text!r}")
    return date.fromisoformat(day_text).toordinal(), hour * 3600 + minute * 60 + second


def _count(text: str, name: str, minimum: int, path: str, line_number: int) -> int:
    stripped = text.strip()
    if not _INTEGER.fullmatch(stripped):
        raise TraceFormatError(path, line_number, f"{name} is not an integer: {short(text)}")
    if stripped.startswith("-"):
        raise TraceFormatError(path, line_number, f"{name} must be >= {minimum}, got {short(stripped)}")
    # Length first: int() of thousands of digits is refused (and slow) before any comparison.
    if len(stripped) > len(str(MAX_REQUEST_TOKENS)) or int(stripped) > MAX_REQUEST_TOKENS:
        raise TraceFormatError(
            path, line_number, f"{name} must be at most {MAX_REQUEST_TOKENS}, got {short(stripped)}"
        )
    value = int(stripped)
    if value < minimum:
        raise TraceFormatError(path, line_number, f"{name} must be >= {minimum}, got {value}")
    return value


def read_azure(
    path: str | Path, limit: int | None = None, with_tokens: bool = True
) -> Iterator[TraceRequest]:
    """Yield the rows of an Azure 2023 CSV as ``TraceRequest`` values, lazily.

    ``with_tokens=False`` leaves ``prompt_token_ids`` empty (see ``TraceRequest.token_ids``).
    """
    name = str(path)
    source = Path(path).name
    lines = read_lines(path, name)
    header = next((_cells(text) for _, text in lines), None)
    if header is None or tuple(cell.strip() for cell in header) != AZURE_COLUMNS:
        raise TraceFormatError(name, 1, f"expected header {','.join(AZURE_COLUMNS)}, got {short(header)}")
    origin: tuple[int, float] | None = None
    sequence = 0
    for line_number, text in lines:
        if limit is not None and sequence >= limit:
            return
        row = _cells(text)
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != 3:
            raise TraceFormatError(name, line_number, f"expected 3 columns, got {len(row)}")
        try:
            stamp = parse_azure_timestamp(row[0])
        except ValueError as error:
            raise TraceFormatError(name, line_number, f"bad TIMESTAMP {short(row[0])}: {error}") from None
        prompt = _count(row[1], "ContextTokens", 1, name, line_number)
        output = _count(row[2], "GeneratedTokens", 0, name, line_number)
        problem = length_problem(prompt, output)
        if problem is not None:
            raise TraceFormatError(name, line_number, problem)
        if origin is None:
            origin = stamp
        arrival_s = (stamp[0] - origin[0]) * _SECONDS_PER_DAY + (stamp[1] - origin[1])
        yield TraceRequest(
            request_id=f"{source}#{line_number}",
            sequence=sequence,
            arrival_s=arrival_s,
            prompt_length=prompt,
            output_length=output,
            source=source,
            private_tail=prompt,
            prompt_token_ids=tuple(private_tokens(sequence, prompt)) if with_tokens else (),
        )
        sequence += 1


def _cells(text: str) -> list[str]:
    """The cells of one CSV line (no quoted newlines in this format)."""
    return next(csv.reader([text]), [])
