"""What vLLM 0.33's hybrid KV-cache coordinator reads before it decides (no events here).

A hybrid model has several KV-cache groups (full attention, sliding window,
Mamba) sharing one block pool.  On the core each group of a request is its
own block-mode request, named by :func:`group_holder`, and each group's
chain is its own path in the prefix tree (the group id leads the block's
extra keys, see ``kvstate.vllm.request.GroupChain``), so a group's cached
blocks are the copies on its path.  Here:

* ``HybridLayout`` / ``GroupRule``: the groups as the planner sees them;
* ``GroupCursor``: vLLM's per-request, per-group scheduler-side counters
  (``num_cached_block``, Mamba's state-block bookkeeping), an input and an
  output of the decisions, never core state;
* ``longest_hit``: the fixed-point longest hit across groups;
* ``retained``: which newly full blocks a group caches (retention masks).

The free-block predictor is in ``kvstate.planner.hybrid_step``; the
decisions built on both are in ``kvstate.planner.hybrid_vllm``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from operator import attrgetter
from typing import Any, Protocol

import attrs
import msgspec

from kvstate.planner.alloc import cdiv
from kvstate.planner.block_hits import NULL, BlockChain, Running
from kvstate.state import ROOT, RequestId

FULL, SWA, MAMBA = "full", "swa", "mamba"


@attrs.frozen
class GroupRule:
    """One KV-cache group: ``kind`` (full / swa / mamba), the sliding window, the tokens kept
    below it, and the per-request admission cap in blocks (sliding window only)."""

    kind: str
    window: int = 0
    extra_retained: int = 0
    admission_cap: int | None = None


@attrs.frozen
class HybridLayout:
    """The groups, the lookup order (equal specs together, full attention first), the
    retention interval (None: dense), whether caching is on, and whether the coordinator
    is vLLM's hybrid one (it rounds cacheable tokens down to the scheduler block)."""

    rules: tuple[GroupRule, ...]
    lookups: tuple[tuple[int, ...], ...]
    retention: int | None
    caching: bool
    hybrid: bool
    releases: bool = attrs.field(init=False)  # a group frees blocks as tokens are computed
    has_mamba: bool = attrs.field(init=False)

    @releases.default
    def _any_release(self) -> bool:
        return any(rule.kind != FULL for rule in self.rules)

    @has_mamba.default
    def _any_mamba(self) -> bool:
        return any(rule.kind == MAMBA for rule in self.rules)


class GroupCursor(msgspec.Struct, frozen=True, gc=False):
    """vLLM's per-group counters of one request.

    ``cached``: ``num_cached_block`` (+ tree memo), None while vLLM does not
    track the request (then it is not "running" for that group).  Mamba
    only: ``retired`` (``_num_retired_blocks``).  vLLM also keeps
    ``last_state_block_idx`` to free the state block of two steps back; that block
    always lies below ``retired`` once the step's retirement ran, where every entry
    is already null, so the free never happens and kvstate keeps no such counter
    (``kvstate.planner.hybrid_vllm._mamba_remove``).  Nor does it keep
    ``_allocated_block_reqs``: without speculative blocks and prefill checkpoints
    (not modelled), that set only decides ``last_state_block_idx``.
    An immutable msgspec struct: a decision makes several, and a struct is built in C (it
    holds a ``Running`` and ints, never a cycle, so the collector need not track it).
    """

    cached: Running | None = None
    retired: int = 0


CACHED = attrgetter("cached")  # a cursor's ``cached`` (C-level, for ``map`` over the groups)


class GroupedRequest(Protocol):
    """A request as the hybrid planner reads it (``kvstate.vllm.Request`` is one)."""

    @property
    def block_hashes(self) -> Sequence[bytes]: ...
    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def shared_prefix_boundary(self) -> int: ...
    def group_chain(self, group: int) -> BlockChain: ...


FreshStates = Collection[tuple[int, bytes]]  # (group, block hash) of Mamba states cached this step


def group_holder(request_id: RequestId, group: int) -> str:
    """The core request that holds group ``group``'s table of ``request_id``."""
    return f"{request_id}/g{group}"


def group_holders(request_id: RequestId, count: int) -> tuple[str, ...]:
    """The core requests of all ``count`` groups of ``request_id``, in group order."""
    return tuple(f"{request_id}/g{group}" for group in range(count))


def skipped_blocks(rule: GroupRule, num_computed: int, size: int) -> int:
    """Whole blocks a group no longer reads at ``num_computed`` tokens (floor; Mamba's may be -1)."""
    if rule.kind == SWA:
        return max(0, num_computed - rule.window + 1 - rule.extra_retained) // size
    if rule.kind == MAMBA:
        return (num_computed - 1) // size
    return 0


# -- the longest hit ---------------------------------------------------------------------------
def group_copies(state: Any, chain: BlockChain, limit: int) -> list[int]:
    """Per chain position (at most ``limit``) the first cached copy of its node, NULL for a
    hollow node; shorter than ``limit`` where the path ends (no later position is cached)."""
    nodes = state.nodes
    keys = chain.block_keys
    out: list[int] = []
    current = nodes[ROOT]
    for position in range(min(limit, len(keys))):
        child = current.children.get(keys[position])
        if child is None:
            break
        current = nodes[child]
        out.append(current.pages[0] if current.pages else NULL)
    return out


def _lookup(rule: GroupRule, copies: Sequence[list[int]], limit: int,
            size: int) -> tuple[list[list[int]], int]:
    """One spec group's hit below ``limit`` blocks: per member group its blocks, and the tokens."""
    if len(copies) == 1:
        known = copies[0][:limit]
        present = [page != NULL for page in known] + [False] * (limit - len(known))
    else:
        present = [all(index < len(c) and c[index] != NULL for c in copies)
                   for index in range(limit)]
    if rule.kind == FULL:
        run = present.index(False) if False in present else limit
        return [c[:run] for c in copies], run * size
    if rule.kind == MAMBA:  # the right-most cached state
        for index in range(limit - 1, -1, -1):
            if present[index]:
                return [[NULL] * index + [c[index]] for c in copies], (index + 1) * size
        return [[] for _ in copies], 0
    need = cdiv(rule.window - 1, size)  # sliding window: right to left, the first long-enough run
    run = 0
    for index in range(limit - 1, -1, -1):
        if not present[index]:
            run = 0
            continue
        run += 1
        if run >= need:
            return [[NULL] * index + c[index:index + run] for c in copies], (index + run) * size
    return [c[:run] for c in copies], run * size


def longest_hit(state: Any, layout: HybridLayout, request: GroupedRequest,
                max_tokens: int) -> tuple[tuple[tuple[int, ...], ...], int, int]:
    """vLLM's ``find_longest_cache_hit``: per group the hit blocks, the hit tokens, and the tokens
    a group cached past the agreed hit (the uncached shared prefix; 0 unless hybrid).

    Each spec group may only shorten the candidate; full attention is looked
    up once and truncated at the end; a full + one-other layout stops after
    one pass, as vLLM's "simple hybrid".
    """
    size = state.geometry.page_size
    count = len(layout.rules)
    walked: list[list[int] | None] = [None] * count  # walked once, at the longest limit asked

    def copies(group: int, limit: int) -> list[int]:
        found = walked[group]
        if found is None:
            found = walked[group] = group_copies(state, request.group_chain(group), limit)
        return found

    blocks: list[list[int] | None] = [None] * count
    lengths = [0] * count
    hit_length = max_tokens
    longest = 0
    simple = len(layout.lookups) == 2 and layout.rules[layout.lookups[0][0]].kind == FULL
    while True:
        current = hit_length
        for members in layout.lookups:
            rule = layout.rules[members[0]]
            if rule.kind == FULL and blocks[members[0]] is not None:
                current = min(current, lengths[members[0]])  # downward closed: trim later
                continue
            limit = max(0, current) // size
            found, current = _lookup(rule, [copies(g, limit) for g in members], limit, size)
            for group, pages in zip(members, found, strict=True):
                blocks[group] = pages
                lengths[group] = current
            longest = max(longest, current)
        if current >= hit_length:
            break
        hit_length = current
        if simple:
            break
    for members in layout.lookups:
        if layout.rules[members[0]].kind == FULL:
            for group in members:
                found_blocks = blocks[group]
                if found_blocks is not None:
                    del found_blocks[cdiv(hit_length, size):]
    return tuple(tuple(pages or ()) for pages in blocks), hit_length, longest - hit_length


# -- retention ----------------------------------------------------------------------------------
def retained(rule: GroupRule, retention: int | None, start: int, end: int, size: int,
             boundaries: Sequence[int]) -> list[bool] | None:
    """vLLM's ``reachable_block_mask`` for blocks ``[start, end)``; None: cache every block.

    Sliding window: the ``cdiv(W - 1, size)``-block tails that end on a
    segment boundary (every block when dense) and on each reachable
    boundary (the replay boundary ``num_prompt - 1`` and a shared-prefix
    junction).  Mamba: the single state block ending on each of those.
    """
    if rule.kind == FULL or (rule.kind == MAMBA and retention is None):
        return None
    mask = [False] * (end - start)
    if rule.kind == SWA:
        need = cdiv(rule.window - 1, size)
        segment = size if retention is None else retention
        if segment:
            per_segment = segment // size
            if need >= per_segment:
                return None
            for index in range(start, end):
                mask[index - start] = index % per_segment >= per_segment - need
        if retention is not None:
            for boundary in boundaries:
                stop = boundary // size
                for index in range(max(start, stop - need), min(end, stop)):
                    mask[index - start] = True
        return mask
    if retention:
        per_segment = retention // size
        if per_segment <= 1:
            return None
        first = (start + per_segment) // per_segment * per_segment - 1
        for index in range(first - start, len(mask), per_segment):
            mask[index] = True
    for boundary in boundaries:
        index = boundary // size - 1
        if start <= index < end:
            mask[index - start] = True
    return mask


def reachable_boundaries(request: GroupedRequest) -> tuple[int, ...]:
    """The positions a later request can resume at: the replay boundary and the junction."""
    junction = request.shared_prefix_boundary
    replay = request.num_prompt_tokens - 1
    return (replay, junction) if junction else (replay,)
