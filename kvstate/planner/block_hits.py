"""What vLLM's manager reads before it decides: prefix hits and the capacity predictor.

No events here: ``cached_prefix`` (the hit of ``get_computed_blocks``;
``window_hit`` for a sliding window), ``blocks_to_allocate`` (vLLM 0.33's
prediction of the free blocks a call consumes) and ``check_hits`` (a
caller's hits are cached copies of its chain).  The decisions built on them
are in ``kvstate.planner.block``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from kvstate.planner.alloc import cdiv
from kvstate.state import ROOT, RequestId

NULL = 0  # the null block: pads sliding-window tables; never held, queued or cached


class BlockChain(Protocol):
    """A request's full blocks as the prefix tree keys them (``kvstate.vllm.Request`` is one)."""

    @property
    def block_keys(self) -> Sequence[tuple[Any, ...]]: ...  # child key of each full block
    @property
    def block_extra_keys(self) -> Sequence[Any]: ...  # tagged extra keys of each, or None
    def block_tokens(self, index: int) -> tuple[int, ...]: ...


class Running(msgspec.Struct, frozen=True, gc=False):
    """vLLM's ``num_cached_block`` of a running request, and ``last_node``: the tree node of
    entry ``num_cached - 1`` (ROOT: unknown).  Node ids are never reused, so that memo is
    right exactly while the node is still in the tree.  (An immutable msgspec struct: one is
    made per caching call, and a struct is built in C, several times faster than a named
    tuple or an attrs class; it holds ints only, so the collector need not track it.)"""

    num_cached: int = 0
    last_node: int = ROOT


def skipped_tokens(window: int | None, num_computed: int) -> int:
    """Tokens before the attention window of the next token (0 for full attention)."""
    return 0 if window is None else max(0, num_computed - window + 1)


def cached_prefix(state: Any, chain: BlockChain, max_blocks: int, window: int | None) -> list[int]:
    """The hit of ``get_computed_blocks``: per position the first cached copy of its node.

    Full attention: the leading run of cached positions; sliding window:
    ``window_hit`` over the first ``max_blocks`` positions.
    """
    nodes = state.nodes
    keys = chain.block_keys
    copies: list[int] = []  # NULL: a hollow node (sliding window only)
    current = nodes[ROOT]
    for position in range(min(max_blocks, len(keys))):
        child = current.children.get(keys[position])
        if child is None:
            break
        current = nodes[child]
        if current.pages:
            copies.append(current.pages[0])
        elif window is None:
            break
        else:
            copies.append(NULL)
    if window is None:
        return copies
    copies.extend([NULL] * (max_blocks - len(copies)))
    return window_hit(copies, window, state.geometry.page_size)


def window_hit(copies: Sequence[int], window: int, block_size: int) -> list[int]:
    """A sliding-window hit from each position's cached copy (NULL: a miss), vLLM's scan.

    Right to left, the first run of ``cdiv(window - 1, block_size)`` cached
    positions ends the hit (the positions before it become NULL); with no
    such run, the leading run from position 0.
    """
    need = cdiv(window - 1, block_size)
    run = 0
    for index in range(len(copies) - 1, -1, -1):
        if copies[index] == NULL:
            run = 0
            continue
        run += 1
        if run >= need:
            return [NULL] * index + list(copies[index:index + run])
    return list(copies[:run])


def blocks_to_allocate(state: Any, request_id: RequestId, running: bool, num_tokens: int,
                       hits: Sequence[int], total_computed: int, window: int | None,
                       cap: int | None = None) -> int:
    """How many free blocks giving the request ``num_tokens`` slots consumes (vLLM's predictor).

    A running request takes no hits (``ValueError``).  A new one needs the
    blocks past its hits and the window's skipped prefix, plus every kept hit
    nobody holds (holding it takes it off the free queue).  ``cap`` bounds the
    blocks the request is counted to need (vLLM's sliding-window admission cap).
    """
    size = state.geometry.page_size
    required = cdiv(num_tokens, size) if cap is None else min(cdiv(num_tokens, size), cap)
    record = state.requests.get(request_id)
    table = 0 if record is None else len(record.pages)
    if running:
        if hits:
            raise ValueError(f"running request {request_id!r} cannot take new prefix hits")
        return max(required - table, 0)
    skipped = skipped_tokens(window, total_computed) // size
    new = max(required - max(skipped, len(hits) + table), 0)
    if not hits:
        return new
    holders = state.holders
    kept = hits[max(0, skipped - table):]
    return new + len([page for page in kept if page != NULL and page not in holders])


def check_hits(state: Any, request_id: RequestId, chain: BlockChain, running: Running | None,
               hits: Sequence[int], num_local: int, *, window: int | None, caching: bool,
               found_here: bool = False, real_from: int | None = None) -> None:
    """``ValueError`` unless ``hits`` can be the ``get_computed_blocks`` hit of a new request.

    Each real hit must be a cached copy of the node at its chain position
    (the node its parent indexes under the chain's key there), once; a
    running request or one that already has blocks takes none.  The null
    block stands only for a position the request no longer reads: none from
    ``real_from`` on (default: the window's first block, every position for
    full attention).
    ``found_here``: the caller's own lookup returned ``hits`` for this chain
    in this very state, so the per-block check is skipped (the others are not).
    """
    if running is not None:
        if hits:
            raise ValueError(f"running request {request_id!r} cannot take new prefix hits")
        return
    record = state.requests.get(request_id)
    if record is not None and record.pages:
        raise ValueError(f"request {request_id!r} already has blocks; only a new request "
                         "takes prefix hits")
    if not found_here:
        keys = chain.block_keys
        if len(hits) > len(keys):
            raise ValueError(f"{len(hits)} hit blocks for {len(keys)} full blocks")
    skipped = skipped_tokens(window, num_local) // state.geometry.page_size
    if not caching and len(hits) > skipped:
        raise ValueError("computed blocks must be empty when prefix caching is disabled")
    if found_here:
        return
    page_node, nodes = state.page_node, state.nodes
    seen: set[int] = set()
    first_read = skipped if real_from is None else real_from
    for position, page in enumerate(hits):
        if page == NULL:
            if position >= first_read:  # tokens the request attends to, in no block
                raise ValueError(f"hit block {position} of request {request_id!r} is the null "
                                 "block, inside what the request still reads")
            continue
        node_id = page_node.get(page, -1)
        node = nodes.get(node_id)
        if node is None or page in seen or \
                nodes[node.parent].children.get(keys[position]) != node_id:
            raise ValueError(f"block {page} is not a cached copy of block {position} of request "
                             f"{request_id!r} (or it is given twice)")
        seen.add(page)
