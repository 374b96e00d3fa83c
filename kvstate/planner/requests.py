"""Request-level cache flows with SGLang 0.5.23's exact index arithmetic.

A request's row (P = page size, K = page-aligned length of what it caches)::

    0 ........ protected_len ........ prefix_len ........ K ........ owned
    | tree, locked by the request | duplicates of tree | new tree | own partial |
                                    pages (freed)       pages      page (freed
                                                        (inserted)  on finish)

``plan_checkpoint`` publishes ``token_ids[:up_to]`` (SGLang's checkpoint /
``cache_unfinished_req``): insert, split the leaf at the prompt boundary,
free the duplicates, re-match, rebind the row to the canonical tree slots,
and move the lock.  ``plan_release`` (``cache_finished_req`` / retract)
optionally checkpoints, then closes the row and frees what the request
still owns.  The request's cursor (``RequestCursor``) is what SGLang keeps
on ``Req``: it is an input and an output here, never core state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from kvstate.events import Assign, Free, Lock, ReqFree, Truncate, Unlock
from kvstate.planner.builder import Builder
from kvstate.planner.tree_ops import plan_insert, plan_match
from kvstate.state import DETACHED, ROOT, RequestId


@attrs.frozen
class RequestCursor:
    request: RequestId
    protected_len: int = 0  # tokens [0, protected_len) belong to the tree
    last_node: int = ROOT  # node this request holds a lock on (ROOT: none)


def pages_of_segment(state: Any, request_id: RequestId, start: int, stop: int) -> list[int]:
    """Distinct pages backing positions ``[start, stop)`` of a request, in row order."""
    if stop <= start:
        return []
    size = state.geometry.page_size
    table = state.requests[request_id].pages
    return [table[index] for index in range(start // size, -(-stop // size))]


def free_detached(b: Builder, pages: Sequence[int], *, at_head: bool) -> None:
    """Free the pages of a segment that nobody holds any more (skip tree and shared pages)."""
    holders = b.state.holders
    detached = [p for p in dict.fromkeys(pages) if holders.get(p) == (DETACHED,)]
    if detached:
        b.emit(Free(tuple(detached), at_head))


def plan_checkpoint(
    b: Builder,
    cursor: RequestCursor,
    token_ids: Sequence[int],
    *,
    prompt_len: int,
    up_to: int,
    at_head: bool,
) -> RequestCursor:
    """Publish ``token_ids[:up_to]`` and rebind the row; the new cursor.

    Emits the inserts' ``Touch``/``Split``/``Insert``, the re-match's
    ``Touch``/``Split``, an ``Assign`` of the canonical slots, a ``Free`` of
    the duplicates, and ``Unlock``/``Lock`` when the locked node moves.
    """
    state = b.state
    request_id = cursor.request
    size = state.geometry.page_size
    key = tuple(token_ids[:up_to])
    aligned = len(key) // size * size
    pages = tuple(state.requests[request_id].pages[:aligned // size])
    inserted = plan_insert(b, key[:aligned], None, request_id, pages=pages)
    prompt_aligned = min(prompt_len, len(key)) // size * size
    if 0 < prompt_aligned < aligned:
        # Split at the prompt boundary so the output part can be evicted alone.
        plan_insert(b, key[:prompt_aligned], None, request_id, pages=pages)
    matched = plan_match(b, key[:aligned])
    # The request's own copies of what the tree had already: freed below.
    duplicate_pages = list(dict.fromkeys(
        pages[cursor.protected_len // size: -(-inserted.prefix_len // size)]))
    if aligned > cursor.protected_len and matched.pages[cursor.protected_len // size:] != pages[
            cursor.protected_len // size:]:
        b.emit(Assign(request_id, cursor.protected_len, matched.slots_from(cursor.protected_len)))
    free_detached(b, duplicate_pages, at_head=at_head)
    if matched.last_node != cursor.last_node:
        if cursor.last_node != ROOT:
            b.emit(Unlock(cursor.last_node))
        if matched.last_node != ROOT:
            b.emit(Lock(matched.last_node))
    return RequestCursor(request_id, aligned, matched.last_node)


def plan_release(
    b: Builder,
    cursor: RequestCursor,
    token_ids: Sequence[int],
    *,
    prompt_len: int,
    owned: int,
    checkpoint: bool,
    at_head: bool,
    close_row: bool = True,
) -> None:
    """Finish (``checkpoint=True``) or retract (``False``) a request.

    ``owned`` is the KV length the request has written (SGLang's committed
    length); only ``token_ids[:owned]`` is cached.  Frees the owned range
    ``[protected_len, allocated)`` page by page in row order, drops the
    lock, and closes the row unless ``close_row`` is False (then the row is
    truncated to its tree-owned prefix).  Emits a checkpoint's events, then
    ``ReqFree`` (or ``Truncate``), ``Free`` and ``Unlock``.
    """
    request_id = cursor.request
    if checkpoint:
        cursor = plan_checkpoint(b, cursor, token_ids, prompt_len=prompt_len, up_to=owned,
                                 at_head=at_head)
    state = b.state
    allocated = state.requests[request_id].allocated
    own_pages = pages_of_segment(state, request_id, cursor.protected_len, allocated)
    if close_row:
        b.emit(ReqFree((request_id,)))
    else:
        b.emit(Truncate(request_id, cursor.protected_len))
    free_detached(b, own_pages, at_head=at_head)
    if cursor.last_node != ROOT:
        b.emit(Unlock(cursor.last_node))
