"""The record every trace reader yields, and the one error they raise.

``TraceRequest`` is an immutable value: readers create it, nobody mutates it.
``TraceFormatError`` is raised for any malformed input and always names the
file (or archive member) and the line or JSON location of the problem, so a
user can fix the input without guessing.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvstate.traces.tokens import prompt_tokens


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


def _check_tokens(instance: TraceRequest, attribute: attrs.Attribute[Any], value: tuple[int, ...]) -> None:
    if value and len(value) != instance.prompt_length:
        raise ValueError(f"{len(value)} token ids for prompt_length {instance.prompt_length}")


@attrs.frozen(slots=True)
class TraceRequest:
    """One request of a trace, with synthetic prompt token ids.

    Attributes:
        request_id: unique within one stream (for example ``"conversation_trace.jsonl#17"``).
        sequence: 0-based position in the stream; it breaks arrival-time ties in file order
            and seeds the request's private token ids.
        arrival_s: arrival time in seconds, relative to the trace's own origin.
        prompt_length: number of prompt tokens.
        output_length: number of tokens the request generates.
        source: name of the file the request came from.
        conversation: conversation or session tag (empty when the format has none).
        block_size: the trace's hash-block size in tokens (0 when it has no hashes).
        block_keys: namespaced hash-block keys, one per hashed block, in prompt order;
            empty for formats without prefix information.
        block_token_counts: tokens covered by each entry of ``block_keys``.
        private_tail: prompt tokens after the hashed blocks that the trace does not
            hash; they get ids no other request shares.
        prompt_token_ids: the synthetic token ids (``token_ids()``), stored when the
            reader was asked for them (the default) and ``()`` otherwise.  Two
            requests share a token prefix exactly when the trace says they share
            the block prefix (see ``kvstate.traces.tokens``).
    """

    request_id: str
    sequence: int
    arrival_s: float
    prompt_length: int
    output_length: int
    source: str
    conversation: str = ""
    block_size: int = 0
    block_keys: tuple[int, ...] = attrs.field(default=(), converter=_as_int_tuple, repr=False)
    block_token_counts: tuple[int, ...] = attrs.field(default=(), converter=_as_int_tuple, repr=False)
    private_tail: int = 0
    prompt_token_ids: tuple[int, ...] = attrs.field(
        default=(), converter=_as_int_tuple, validator=_check_tokens, repr=False
    )

    def __attrs_post_init__(self) -> None:
        covered = sum(self.block_token_counts) + self.private_tail
        if len(self.block_keys) != len(self.block_token_counts) or covered != self.prompt_length:
            raise ValueError(
                f"{self.request_id}: blocks cover {covered} tokens, prompt_length is {self.prompt_length}"
            )

    def token_ids(self) -> tuple[int, ...]:
        """The synthetic prompt token ids; computed (not stored) when the reader skipped them."""
        if self.prompt_token_ids or not self.prompt_length:
            return self.prompt_token_ids
        return prompt_tokens(
            self.block_keys, self.block_token_counts, self.block_size, self.sequence, self.private_tail
        )

    def with_token_ids(self) -> TraceRequest:
        """A copy that stores its token ids (``self`` if it already does); ``self`` is unchanged."""
        if self.prompt_token_ids or not self.prompt_length:
            return self
        return attrs.evolve(self, prompt_token_ids=self.token_ids())
