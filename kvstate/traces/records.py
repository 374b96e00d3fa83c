"""The record every trace reader yields, and the one error they raise.

``TraceRequest`` is an immutable value: readers create it, nobody mutates it.
``TraceFormatError`` is raised for any malformed input and always names the
file (or archive member) and the line or JSON location of the problem, so a
user can fix the input without guessing.
"""

from __future__ import annotations

import attrs


class TraceFormatError(ValueError):
    """A trace file could not be read: ``path`` and ``line_number`` say where.

    ``line_number`` is 1-based for line-oriented formats (JSONL, CSV) and the
    JSON decoder's line for JSON documents; it is ``None`` when the problem has
    no single line (for example a missing archive member).
    """

    def __init__(self, path: str, line_number: int | None, reason: str) -> None:
        self.path = path
        self.line_number = line_number
        self.reason = reason
        where = path if line_number is None else f"{path}:{line_number}"
        super().__init__(f"{where}: {reason}")


def _as_int_tuple(values: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(values)


@attrs.frozen(slots=True)
class TraceRequest:
    """One request of a trace, with synthetic prompt token ids.

    Attributes:
        request_id: unique within one stream (for example ``"conversation_trace.jsonl#17"``).
        sequence: 0-based position in the stream; it breaks arrival-time ties in file order.
        arrival_s: arrival time in seconds, relative to the trace's own origin.
        prompt_token_ids: synthetic token ids.  Two requests share a token prefix
            exactly when the trace says they share the block prefix (see ``tokens``).
        output_length: number of tokens the request generates.
        source: name of the file the request came from.
        conversation: conversation or session tag (empty when the format has none).
        block_size: the trace's hash-block size in tokens (0 when it has no hashes).
        block_keys: namespaced hash-block keys, one per hashed block, in prompt order;
            empty for formats without prefix information.
        block_token_counts: tokens covered by each entry of ``block_keys``.
    """

    request_id: str
    sequence: int
    arrival_s: float
    prompt_token_ids: tuple[int, ...] = attrs.field(converter=_as_int_tuple, repr=False)
    output_length: int
    source: str
    conversation: str = ""
    block_size: int = 0
    block_keys: tuple[int, ...] = attrs.field(default=(), converter=_as_int_tuple, repr=False)
    block_token_counts: tuple[int, ...] = attrs.field(default=(), converter=_as_int_tuple, repr=False)

    @property
    def prompt_length(self) -> int:
        """Number of prompt tokens (``len(prompt_token_ids)``)."""
        return len(self.prompt_token_ids)
