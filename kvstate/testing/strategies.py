"""Hypothesis strategies for kvstate tests: tokens, lengths, scopes and workloads.

Vocabularies are tiny on purpose (two or three token ids) so prefixes
collide, and lengths are biased to page boundaries (``P - 1``, ``P``,
``P + 1``) where off-by-one bugs live.  All strategies are pure values.
"""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import strategies as st


@attrs.frozen
class MachineScope:
    """Geometry and vocabulary a state machine run draws in ``initialize``."""

    num_pages: int
    page_size: int
    num_rows: int
    vocab: int


def boundary_lengths(page_size: int, *, max_pages: int = 3) -> st.SearchStrategy[int]:
    """Token counts, mostly ``k*P - 1``, ``k*P``, ``k*P + 1`` for small k (never below 1)."""
    near = sorted({n for k in range(1, max_pages + 1)
                   for n in (k * page_size - 1, k * page_size, k * page_size + 1) if n >= 1})
    return st.one_of(st.sampled_from(near), st.integers(1, max_pages * page_size + 1))


def token_sequences(vocab: int = 2, page_size: int = 1, *, max_pages: int = 3
                    ) -> st.SearchStrategy[tuple[int, ...]]:
    """Token tuples over ``1..vocab`` with page-boundary-biased lengths."""
    return boundary_lengths(page_size, max_pages=max_pages).flatmap(
        lambda n: st.tuples(*[st.integers(1, vocab)] * n))


def machine_scopes(*, max_pages: int = 5, page_sizes: tuple[int, ...] = (1, 2, 4),
                   max_rows: int = 3) -> st.SearchStrategy[MachineScope]:
    return st.builds(MachineScope, num_pages=st.integers(2, max_pages),
                     page_size=st.sampled_from(page_sizes), num_rows=st.integers(1, max_rows),
                     vocab=st.integers(2, 3))


def workloads(vocab: int = 2, page_size: int = 1, *, max_requests: int = 4
              ) -> st.SearchStrategy[list[dict[str, Any]]]:
    """Request lifecycles: ``{"prompt": tokens, "decode": n, "finish": bool}`` each.

    Prompts share prefixes often (they are drawn from a few stems).
    """
    stems = st.lists(token_sequences(vocab, page_size), min_size=1, max_size=3)

    def build(stem_list: list[tuple[int, ...]]) -> st.SearchStrategy[list[dict[str, Any]]]:
        request = st.fixed_dictionaries({
            "prompt": st.tuples(st.sampled_from(stem_list), token_sequences(vocab, page_size))
            .map(lambda pair: pair[0] + pair[1][: page_size + 1]),
            "decode": st.integers(0, page_size + 1),
            "finish": st.booleans(),
        })
        return st.lists(request, min_size=1, max_size=max_requests)

    return stems.flatmap(build)


__all__ = ["MachineScope", "boundary_lengths", "machine_scopes", "token_sequences", "workloads"]
