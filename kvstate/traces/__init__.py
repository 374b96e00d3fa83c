"""Trace ingestion: real request traces as streams of ``TraceRequest`` values.

Three formats are read (see each module): Mooncake JSONL (``mooncake``),
kv-cache-tester conversations (``kvcache_tester``) and the Azure 2023 CSVs
(``azure``).  Every reader is a lazy generator that holds at most one line or
one conversation, keeps file order for equal arrival times, and raises
``TraceFormatError`` naming the file and line of malformed input, including
input past the documented bounds of ``limits`` (sizes, lengths, nesting,
encoding): a trace is untrusted input.  Prompt token ids are synthetic and
reproduce the trace's prefix sharing exactly (``tokens``).  ``read_trace``
picks the reader from the path; ``sample.sample_trace`` gives the small trace
shipped in the package.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from kvstate.traces.azure import read_azure
from kvstate.traces.kvcache_tester import read_kvcache_tester
from kvstate.traces.mooncake import read_mooncake
from kvstate.traces.records import TraceFormatError, TraceRequest

TraceFormat = Literal["mooncake", "kvcache-tester", "azure"]
TRACE_FORMATS: tuple[TraceFormat, ...] = ("mooncake", "kvcache-tester", "azure")

__all__ = [
    "TRACE_FORMATS",
    "TraceFormat",
    "TraceFormatError",
    "TraceRequest",
    "detect_format",
    "read_azure",
    "read_kvcache_tester",
    "read_mooncake",
    "read_trace",
]


def detect_format(path: str | Path) -> TraceFormat:
    """Guess the format from the path: ``.jsonl`` Mooncake, ``.csv`` Azure,
    a ``.json`` file, a tar archive or a directory kv-cache-tester."""
    name = str(path).lower()
    if name.endswith(".jsonl"):
        return "mooncake"
    if name.endswith(".csv"):
        return "azure"
    if name.endswith((".json", ".tar.xz", ".txz", ".tar", ".tar.gz", ".tgz")) or Path(path).is_dir():
        return "kvcache-tester"
    raise TraceFormatError(str(path), None, "cannot tell the trace format from the name; pass it")


def read_trace(
    path: str | Path,
    trace_format: TraceFormat | None = None,
    limit: int | None = None,
    block_size: int | None = None,
    with_tokens: bool = True,
) -> Iterator[TraceRequest]:
    """Stream the requests of ``path`` with the reader for ``trace_format``.

    ``block_size`` overrides the Mooncake hash-block size (default 512); the
    other formats carry or need none.  ``limit`` stops after that many requests.
    ``with_tokens=False`` skips storing ``prompt_token_ids`` (see
    ``TraceRequest.token_ids``) for block-level consumers.
    """
    chosen = trace_format or detect_format(path)
    if chosen == "mooncake":
        return read_mooncake(path, block_size=block_size or 512, limit=limit, with_tokens=with_tokens)
    if chosen == "kvcache-tester":
        return read_kvcache_tester(path, limit=limit, with_tokens=with_tokens)
    if chosen == "azure":
        return read_azure(path, limit=limit, with_tokens=with_tokens)
    raise ValueError(f"unknown trace format {chosen!r}; expected one of {TRACE_FORMATS}")
