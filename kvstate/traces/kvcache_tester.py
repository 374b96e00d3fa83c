"""Streaming reader for WEKA kv-cache-tester conversation traces.

A trace is one JSON document per conversation: ``{"id", "block_size": 64,
"hash_id_scope": "local", "requests": [...]}``.  A request is ``{"t": seconds
from the conversation start, "type": "n" | "s", "in", "out", "hash_ids"}``; a
``"subagent"`` entry nests its own ``requests`` whose ``t`` counts from the
entry's own ``t`` and whose ids share the parent's namespace.

``hash_ids`` cover only the full blocks (``floor(in / block_size)`` of them);
the uncovered tail gets private token ids (see ``tokens``).  Because the ids
are local to one conversation, each block key is namespaced by the
conversation's position in the input: ``key = (conversation_index << 32) | id``.

Input can be the ``.tar.xz`` archive (read member by member with ``tarfile``'s
streaming mode; nothing is extracted to disk), a directory of ``*.json`` files
(sorted by name) or a single ``.json`` file.  Only one conversation is held in
memory at a time.  Within a conversation, requests (subagent ones included) are
ordered by arrival time, ties kept in document order.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from kvstate.traces.records import TraceFormatError, TraceRequest
from kvstate.traces.tokens import MAX_PRIVATE_TOKENS, prompt_tokens

KVCACHE_TESTER_BLOCK_SIZE = 64
LOCAL_ID_BITS = 32
ConversationStart = Literal["sequential", "zero"]


def _documents(path: Path) -> Iterator[tuple[str, bytes]]:
    """Yield ``(display name, raw JSON bytes)`` per conversation, in name order."""
    name = str(path)
    if path.is_dir():
        for document in sorted(path.glob("*.json")):
            yield str(document), document.read_bytes()
        return
    if name.endswith((".tar.xz", ".txz", ".tar", ".tar.gz", ".tgz")):
        try:
            with tarfile.open(path, mode="r|*") as archive:
                for member in archive:
                    if not member.isfile() or not member.name.endswith(".json"):
                        continue
                    extracted = archive.extractfile(member)
                    if extracted is None:  # pragma: no cover - isfile() members always extract
                        continue
                    yield f"{name}[{member.name}]", extracted.read()
        except (tarfile.TarError, EOFError, OSError) as error:
            raise TraceFormatError(name, None, f"unreadable archive: {error}") from None
        return
    yield name, path.read_bytes()


def _number(entry: dict[str, Any], field: str, where: str, doc: str) -> float:
    value = entry.get(field)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise TraceFormatError(doc, None, f"{where}: field {field!r} must be a number >= 0, got {value!r}")
    return float(value)


def _count(entry: dict[str, Any], field: str, where: str, doc: str) -> int:
    value = entry.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceFormatError(doc, None, f"{where}: field {field!r} must be an integer >= 0, got {value!r}")
    return value


def _flatten(
    entries: Any, base_s: float, label: str, doc: str, block_size: int
) -> Iterator[tuple[float, str, dict[str, Any]]]:
    """Yield ``(arrival_s, request label, entry)`` for every leaf request, subagents inlined."""
    if not isinstance(entries, list):
        raise TraceFormatError(doc, None, f"{label or 'top level'}: 'requests' must be a list")
    for index, entry in enumerate(entries):
        where = f"{label}requests[{index}]"
        if not isinstance(entry, dict):
            raise TraceFormatError(doc, None, f"{where}: expected an object")
        start = base_s + _number(entry, "t", where, doc)
        if entry.get("type") == "subagent":
            yield from _flatten(entry.get("requests"), start, f"{where}.", doc, block_size)
            continue
        prompt = _count(entry, "in", where, doc)
        _count(entry, "out", where, doc)
        hash_ids = entry.get("hash_ids")
        if not isinstance(hash_ids, list):
            raise TraceFormatError(doc, None, f"{where}: 'hash_ids' must be a list")
        for value in hash_ids:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < (1 << LOCAL_ID_BITS):
                raise TraceFormatError(doc, None, f"{where}: hash id {value!r} is not a 32-bit id")
        if len(hash_ids) != prompt // block_size:
            expected = prompt // block_size
            raise TraceFormatError(
                doc, None, f"{where}: {len(hash_ids)} hash ids for in={prompt}; expected {expected}"
            )
        if prompt - len(hash_ids) * block_size >= MAX_PRIVATE_TOKENS:  # pragma: no cover
            raise TraceFormatError(doc, None, f"{where}: uncovered tail too long")
        yield start, where, entry


def _load(doc: str, raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as error:
        raise TraceFormatError(doc, error.lineno, f"invalid JSON: {error.msg}") from None
    except UnicodeDecodeError as error:
        raise TraceFormatError(doc, None, f"not UTF-8: {error.reason}") from None
    if not isinstance(data, dict):
        raise TraceFormatError(doc, 1, "expected a JSON object per conversation")
    return data


def read_kvcache_tester(
    path: str | Path,
    conversation_start: ConversationStart = "sequential",
    limit: int | None = None,
    conversations: Iterable[str] | None = None,
    with_tokens: bool = True,
) -> Iterator[TraceRequest]:
    """Yield the requests of kv-cache-tester traces lazily.

    ``conversation_start="sequential"`` shifts each conversation to begin at
    the previous one's last arrival, so arrival times never decrease;
    ``"zero"`` keeps each conversation's own clock (every one starts at 0).
    ``conversations`` restricts the stream to those trace ids (namespacing
    still uses the position in the full input, so keys stay stable).
    ``with_tokens=False`` skips storing token ids (the full archive holds
    about 6.8 billion prompt tokens); ``TraceRequest.token_ids()`` still
    computes them per request.
    """
    wanted = None if conversations is None else set(conversations)
    source = Path(path).name
    sequence = 0
    offset_s = 0.0
    for conversation_index, (doc, raw) in enumerate(_documents(Path(path))):
        data = _load(doc, raw)
        trace_id = data.get("id")
        if not isinstance(trace_id, str) or not trace_id:
            raise TraceFormatError(doc, None, "conversation has no string 'id'")
        if wanted is not None and trace_id not in wanted:
            continue
        block_size = data.get("block_size", KVCACHE_TESTER_BLOCK_SIZE)
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise TraceFormatError(doc, None, f"'block_size' must be a positive integer, got {block_size!r}")
        leaves = sorted(_flatten(data.get("requests"), 0.0, "", doc, block_size), key=lambda leaf: leaf[0])
        namespace = conversation_index << LOCAL_ID_BITS
        last_s = 0.0
        for arrival_s, label, entry in leaves:
            if limit is not None and sequence >= limit:
                return
            keys = tuple(namespace | value for value in entry["hash_ids"])
            counts = (block_size,) * len(keys)
            tail = entry["in"] - block_size * len(keys)
            yield TraceRequest(
                request_id=f"{trace_id}/{label}",
                sequence=sequence,
                arrival_s=offset_s + arrival_s,
                prompt_length=entry["in"],
                output_length=entry["out"],
                source=source,
                conversation=trace_id,
                block_size=block_size,
                block_keys=keys,
                block_token_counts=counts,
                private_tail=tail,
                prompt_token_ids=prompt_tokens(keys, counts, block_size, sequence, tail)
                if with_tokens
                else (),
            )
            sequence += 1
            last_s = arrival_s
        if conversation_start == "sequential":
            offset_s += last_s
