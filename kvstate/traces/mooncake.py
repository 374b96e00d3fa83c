"""Streaming reader for Mooncake-style JSONL traces (FAST'25 release format).

Each line is ``{"timestamp": ms, "input_length": n, "output_length": m,
"hash_ids": [...]}``.  ``hash_ids`` are prefix-chained ids of ``block_size``
(512 in the Mooncake release) token blocks; there are ``ceil(n / block_size)``
of them and the last one covers only the remaining ``n - block_size * (k - 1)``
tokens.  Ids are global within the file.

The reader holds one line at a time, yields requests in file order (so equal
timestamps keep their file order) and raises ``TraceFormatError`` naming the
file and line for the first malformed line, including input past the bounds
of ``kvstate.traces.limits`` (lengths, hash ids, line size, encoding).  It
never mutates anything it is given.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvstate.traces.limits import (
    MAX_ARRIVAL_S,
    MAX_BLOCK_SIZE,
    MAX_REQUEST_TOKENS,
    length_problem,
    max_hash_id,
    parse_json,
    read_lines,
    short,
)
from kvstate.traces.records import TraceFormatError, TraceRequest
from kvstate.traces.tokens import prompt_tokens

MOONCAKE_BLOCK_SIZE = 512


def _int_field(record: dict[str, Any], name: str, minimum: int, where: tuple[str, int]) -> int:
    value = record.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceFormatError(where[0], where[1], f"field {name!r} must be an integer, got {short(value)}")
    if value < minimum:
        raise TraceFormatError(where[0], where[1], f"field {name!r} must be >= {minimum}, got {value}")
    if value > MAX_REQUEST_TOKENS:
        raise TraceFormatError(
            where[0], where[1], f"field {name!r} must be at most {MAX_REQUEST_TOKENS}, got {short(value)}"
        )
    return value


def parse_mooncake_line(
    line: str, path: str, line_number: int, sequence: int, block_size: int, with_tokens: bool = True
) -> TraceRequest:
    """Parse one JSONL line into a ``TraceRequest`` (raises ``TraceFormatError``)."""
    where = (path, line_number)
    record = parse_json(line, path, line_number)
    if not isinstance(record, dict):
        raise TraceFormatError(path, line_number, "expected a JSON object")
    timestamp = record.get("timestamp")
    if isinstance(timestamp, bool) or not isinstance(timestamp, int | float):
        raise TraceFormatError(
            path, line_number, f"field 'timestamp' must be a number, got {short(timestamp)}"
        )
    # Compared as given: an integer too large for a float must not reach a float conversion.
    if not 0 <= timestamp <= MAX_ARRIVAL_S * 1000:
        raise TraceFormatError(
            path, line_number,
            f"field 'timestamp' must be in [0, {MAX_ARRIVAL_S * 1000}] ms, got {short(timestamp)}",
        )
    input_length = _int_field(record, "input_length", 1, where)
    output_length = _int_field(record, "output_length", 0, where)
    problem = length_problem(input_length, output_length)
    if problem is not None:
        raise TraceFormatError(path, line_number, problem)
    hash_ids = record.get("hash_ids")
    if not isinstance(hash_ids, list):
        raise TraceFormatError(path, line_number, "field 'hash_ids' must be a list of integers")
    largest = max_hash_id(block_size)
    for value in hash_ids:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TraceFormatError(path, line_number, f"hash id {short(value)} is not a non-negative integer")
        if value > largest:
            raise TraceFormatError(
                path, line_number, f"hash id {short(value)} is too large (at most {largest} for "
                f"{block_size}-token blocks, so that token ids fit 64 bits)"
            )
    block_count = -(-input_length // block_size)
    if len(hash_ids) != block_count:
        raise TraceFormatError(
            path,
            line_number,
            f"{len(hash_ids)} hash ids for input_length {input_length}; "
            f"expected ceil({input_length}/{block_size}) = {block_count}",
        )
    counts = [block_size] * block_count
    counts[-1] = input_length - block_size * (block_count - 1)
    return TraceRequest(
        request_id=f"{Path(path).name}#{line_number}",
        sequence=sequence,
        arrival_s=timestamp / 1000.0,
        prompt_length=input_length,
        output_length=output_length,
        source=Path(path).name,
        conversation="",
        block_size=block_size,
        block_keys=tuple(hash_ids),
        block_token_counts=tuple(counts),
        prompt_token_ids=prompt_tokens(hash_ids, counts, block_size, sequence) if with_tokens else (),
    )


def read_mooncake(
    path: str | Path,
    block_size: int = MOONCAKE_BLOCK_SIZE,
    limit: int | None = None,
    with_tokens: bool = True,
) -> Iterator[TraceRequest]:
    """Yield the requests of a Mooncake JSONL file lazily, in file order.

    Blank lines are skipped (but still counted for line numbers).  ``limit``
    stops after that many requests.  ``with_tokens=False`` leaves
    ``prompt_token_ids`` empty (``TraceRequest.token_ids()`` computes them on
    demand), which block-level consumers use to skip the cost.  The file is
    closed when the generator is exhausted or closed.
    """
    if not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise ValueError(f"block_size must be in [1, {MAX_BLOCK_SIZE}], got {block_size}")
    name = str(path)
    sequence = 0
    for line_number, line in read_lines(path, name):
        if limit is not None and sequence >= limit:
            return
        if not line.strip():
            continue
        yield parse_mooncake_line(line, name, line_number, sequence, block_size, with_tokens)
        sequence += 1
