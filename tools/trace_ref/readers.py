"""Trace file readers, independent of ``kvstate.traces``.

Readers only read the files they are given; ``load_mooncake`` returns a new
``BlockTrace`` the caller owns, the others yield fresh records lazily.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .trie import MOONCAKE_BLOCK, BlockTrace


def load_mooncake(path: Path, block_size: int = MOONCAKE_BLOCK) -> BlockTrace:
    trace = BlockTrace()
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            record = json.loads(line)
            hash_ids = record["hash_ids"]
            length = record["input_length"]
            counts = [min(block_size, length - block_size * i) for i in range(len(hash_ids))]
            trace.add(hash_ids, counts, int(record.get("output_length", 0)))
    return trace


def kvtester_conversations(path: Path) -> Iterator[dict[str, Any]]:
    with tarfile.open(path, mode="r|xz") as archive:
        for member in archive:
            handle = archive.extractfile(member) if member.isfile() else None
            if handle is not None:
                yield json.load(handle)


def flat_requests(entries: list[dict[str, Any]], base: float = 0.0) -> Iterator[tuple[float, dict[str, Any]]]:
    for entry in entries:
        if entry["type"] == "subagent":
            yield from flat_requests(entry["requests"], base + entry["t"])
        else:
            yield base + entry["t"], entry


def azure_rows(path: Path) -> Iterator[tuple[int, int]]:
    with path.open(encoding="utf-8") as handle:
        next(handle)
        for line in handle:
            if line.strip():
                _, prompt, output = line.rsplit(",", 2)
                yield int(prompt), int(output)
