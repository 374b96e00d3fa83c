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
ordered by arrival time, ties kept in document order.  Input past the bounds
of ``kvstate.traces.limits`` (document size, lengths, subagent nesting,
encoding) raises ``TraceFormatError``: with the line for encoding and JSON
syntax errors, with the JSON path (``requests[3].requests[0]``) for fields.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from kvstate.traces.limits import (
    MAX_ARRIVAL_S,
    MAX_BLOCK_SIZE,
    MAX_DOCUMENT_BYTES,
    MAX_REQUEST_TOKENS,
    MAX_SUBAGENT_DEPTH,
    decode_document,
    length_problem,
    max_hash_id,
    parse_json,
    short,
)
from kvstate.traces.records import TraceFormatError, TraceRequest
from kvstate.traces.tokens import prompt_tokens

KVCACHE_TESTER_BLOCK_SIZE = 64
LOCAL_ID_BITS = 32
ConversationStart = Literal["sequential", "zero"]


def _documents(path: Path) -> Iterator[tuple[str, bytes]]:
    """Yield ``(display name, raw JSON bytes)`` per conversation, in name order."""
    name = str(path)
    if path.is_dir():
        for document in sorted(path.glob("*.json")):
            yield str(document), _read_bounded(document)
        return
    if name.endswith((".tar.xz", ".txz", ".tar", ".tar.gz", ".tgz")):
        try:
            with tarfile.open(path, mode="r|*") as archive:
                for member in archive:
                    if not member.isfile() or not member.name.endswith(".json"):
                        continue
                    if member.size > MAX_DOCUMENT_BYTES:  # checked before anything is decompressed
                        raise TraceFormatError(f"{name}[{member.name}]", None,
                                               f"document is larger than {MAX_DOCUMENT_BYTES} bytes")
                    extracted = archive.extractfile(member)
                    if extracted is None:  # pragma: no cover - isfile() members always extract
                        continue
                    yield f"{name}[{member.name}]", extracted.read()
        except (tarfile.TarError, EOFError, OSError) as error:
            raise TraceFormatError(name, None, f"unreadable archive: {error}") from None
        return
    yield name, _read_bounded(path)


def _read_bounded(path: Path) -> bytes:
    """The bytes of one document file, refusing one over ``MAX_DOCUMENT_BYTES`` before reading it."""
    if path.stat().st_size > MAX_DOCUMENT_BYTES:
        raise TraceFormatError(str(path), None, f"document is larger than {MAX_DOCUMENT_BYTES} bytes")
    return path.read_bytes()


def _number(entry: dict[str, Any], field: str, where: str, doc: str) -> float:
    value = entry.get(field)
    # Compared as given (NaN fails, and a huge integer never reaches float()).
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_ARRIVAL_S:
        raise TraceFormatError(
            doc, None, f"{where}: field {field!r} must be a number in [0, {MAX_ARRIVAL_S}], "
            f"got {short(value)}"
        )
    return float(value)


def _count(entry: dict[str, Any], field: str, where: str, doc: str) -> int:
    value = entry.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_REQUEST_TOKENS:
        raise TraceFormatError(
            doc, None,
            f"{where}: field {field!r} must be an integer in [0, {MAX_REQUEST_TOKENS}], got {short(value)}",
        )
    return value


def _flatten(
    entries: Any, base_s: float, label: str, doc: str, block_size: int, depth: int = 0
) -> Iterator[tuple[float, str, dict[str, Any]]]:
    """Yield ``(arrival_s, request label, entry)`` for every leaf request, subagents inlined."""
    if depth > MAX_SUBAGENT_DEPTH:
        raise TraceFormatError(doc, None, f"subagents nested more than {MAX_SUBAGENT_DEPTH} deep")
    if not isinstance(entries, list):
        raise TraceFormatError(doc, None, f"{label or 'top level'}: 'requests' must be a list")
    for index, entry in enumerate(entries):
        where = f"{label}requests[{index}]"
        if not isinstance(entry, dict):
            raise TraceFormatError(doc, None, f"{where}: expected an object")
        start = base_s + _number(entry, "t", where, doc)
        if entry.get("type") == "subagent":
            yield from _flatten(entry.get("requests"), start, f"{where}.", doc, block_size, depth + 1)
            continue
        prompt = _count(entry, "in", where, doc)
        problem = length_problem(prompt, _count(entry, "out", where, doc))
        if problem is not None:
            raise TraceFormatError(doc, None, f"{where}: {problem}")
        hash_ids = entry.get("hash_ids")
        if not isinstance(hash_ids, list):
            raise TraceFormatError(doc, None, f"{where}: 'hash_ids' must be a list")
        for value in hash_ids:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < (1 << LOCAL_ID_BITS):
                raise TraceFormatError(doc, None, f"{where}: hash id {short(value)} is not a 32-bit id")
        if len(hash_ids) != prompt // block_size:
            expected = prompt // block_size
            raise TraceFormatError(
                doc, None, f"{where}: {len(hash_ids)} hash ids for in={prompt}; expected {expected}"
            )
        yield start, where, entry


def _load(doc: str, raw: bytes) -> dict[str, Any]:
    data = parse_json(decode_document(raw, doc), doc)
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
        if isinstance(block_size, bool) or not isinstance(block_size, int) or not (
            1 <= block_size <= MAX_BLOCK_SIZE
        ):
            raise TraceFormatError(
                doc, None, f"'block_size' must be an integer in [1, {MAX_BLOCK_SIZE}], "
                f"got {short(block_size)}"
            )
        leaves = sorted(_flatten(data.get("requests"), 0.0, "", doc, block_size), key=lambda leaf: leaf[0])
        namespace = conversation_index << LOCAL_ID_BITS
        if namespace | ((1 << LOCAL_ID_BITS) - 1) > max_hash_id(block_size):  # token ids must fit 64 bits
            raise TraceFormatError(doc, None, f"too many conversations for {block_size}-token blocks")
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
