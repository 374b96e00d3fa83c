"""What one hybrid ``allocate_slots`` step needs, read before it decides (no events here).

* ``blocks_needed``: vLLM 0.33's free-block predictor summed over the
  groups (the coordinator's ``get_num_blocks_to_allocate``), with the
  sliding-window admission cap and the Mamba refusal of a state cached in
  the same step;
* ``step_is_idle``: whether a running request's step would change nothing
  at all (no block leaves a window or a Mamba state, none is added, none is
  cached, no cursor moves).  Most decode steps are idle: a block fills
  every ``block_size`` tokens.  The check follows
  ``kvstate.planner.hybrid_vllm.plan_hybrid_allocate`` step by step and
  answers False wherever that function could emit an event or return
  something else, so an idle step can skip the decision and its batch;
* ``idle_bounds``: after a step, the token counts up to which the
  request's later steps stay idle, so most of them need not even be
  checked (``kvstate.vllm.hybrid_idle``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.planner.block_hits import NULL, blocks_to_allocate
from kvstate.planner.hybrid_hits import (
    MAMBA,
    SWA,
    FreshStates,
    GroupCursor,
    GroupedRequest,
    HybridLayout,
)


def blocks_needed(state: Any, layout: HybridLayout, holders: Sequence[str],
                  hashes: Sequence[bytes], cursors: Sequence[GroupCursor],
                  hits: Sequence[Sequence[int]] | None, *, num_tokens: int, main_tokens: int,
                  total_computed: int, admission: bool, fresh: FreshStates) -> int:
    """vLLM's ``get_num_blocks_to_allocate`` summed over the groups (it may overshoot the pool:
    a Mamba hit on a state cached this step asks for more blocks than exist).  ``hits``
    None: no group has hits."""
    size = state.geometry.page_size
    requests = state.requests
    required = -(-num_tokens // size)
    total = 0
    for group, rule in enumerate(layout.rules):
        record = requests.get(holders[group])
        table = 0 if record is None else len(record.pages)
        given = () if hits is None else hits[group]
        if rule.kind == MAMBA:
            if given and given[-1] != NULL and (group, hashes[len(given) - 1]) in fresh:
                total += state.geometry.num_pages + 2  # vLLM's num_gpu_blocks + 1: never fits
                continue
            new = -(-main_tokens // size) - len(given) - table
            # one running-state block per step (no checkpoint or speculative blocks)
            total += 1 if new > 0 else new
            if given:
                page_holders = state.holders
                total += sum(1 for page in given if page != NULL and page not in page_holders)
            continue
        cap = rule.admission_cap if admission else None
        if cursors[group].cached is not None and not given:  # running: the table grows
            wanted = required if cap is None or cap > required else cap
            if wanted > table:
                total += wanted - table
            continue
        window = rule.window if rule.kind == SWA else None
        computed = total_computed - rule.extra_retained  # the window keeps extra tokens
        total += blocks_to_allocate(state, holders[group], cursors[group].cached is not None,
                                    num_tokens, given, computed, window, cap)
    return total


def step_is_idle(state: Any, layout: HybridLayout, holders: Sequence[str],
                 request: GroupedRequest, cursors: Sequence[GroupCursor], need_slots: int,
                 main_tokens: int, cache_upto: int, remove_upto: int) -> bool:
    """True when ``plan_hybrid_allocate`` without hits and without the full-sequence check
    would emit nothing, keep every cursor and return no blocks.  False is always safe: the
    caller then decides."""
    size = state.geometry.page_size
    requests = state.requests
    required = -(-need_slots // size)
    num_full = 0
    prompt_state = -1  # the table index of the prompt's last state when caching reaches it
    if layout.caching:
        upto = cache_upto // size * size if layout.hybrid else cache_upto
        num_full = min(upto // size, len(request.block_hashes))
        if layout.has_mamba and upto > 0 and upto == (request.num_prompt_tokens - 1) // size * size:
            prompt_state = upto // size - 1
    for rule, holder, cursor in zip(layout.rules, holders, cursors, strict=True):
        cached = cursor.cached
        if num_full and (cached is None or cached.num_cached < num_full):
            return False  # a block to cache
        record = requests.get(holder)
        if record is None:
            return False
        table = record.pages
        length = len(table)
        kind = rule.kind
        if kind == MAMBA:
            if -(-main_tokens // size) > length:
                return False  # a new state block
            if remove_upto > 1 and cursor.retired < min((remove_upto - 1) // size, length):
                return False  # states to retire
            if 0 <= prompt_state < length and table[prompt_state] != NULL and \
                    table[prompt_state] not in state.page_node:
                return False  # the prompt's state lost its cache entry: cached again
        elif required > length:
            return False  # the table grows
        elif kind == SWA:
            skipped = remove_upto - rule.extra_retained - rule.window + 1
            count = min(skipped // size, length) if skipped >= size else 0
            if count and table[count - 1] != NULL:
                return False  # a block left the window
    return True


FOREVER = 1 << 62  # an upper bound no token count reaches
IdleBounds = tuple[int, int, int, int, int]  # need_hi, main_hi, cache_lo, cache_hi, remove_hi


def idle_bounds(state: Any, layout: HybridLayout, holders: Sequence[str],
                request: GroupedRequest, cursors: Sequence[GroupCursor], cache_upto: int,
                remove_upto: int) -> IdleBounds | None:
    """Bounds within which ``step_is_idle`` holds for the request's next steps, or None.

    Read right after a step that left the request with ``cursors`` and its
    tables in ``state`` (``cache_upto``, ``remove_upto``: that step's).  Until the request's
    tables or cursors change, every later step without hits and without the
    full-sequence check whose ``need_slots <= need_hi``, ``main_tokens <=
    main_hi``, ``cache_lo <= cache_upto <= cache_hi`` and ``remove_upto <=
    remove_hi`` is idle.  Each bound is where one test of ``step_is_idle``
    could first answer False: those tests only grow with the counts (more
    slots, more full blocks, more blocks past a window or a state), except
    the Mamba prompt-state test, which reads the shared cache: a prompt state
    that lost its cache entry is kept out of the range, one still cached must
    stay cached for the bounds to hold (a held block leaves the cache only
    through ``evict_blocks``; the manager drops its bounds there).  The
    tables read here change only through events naming the request's
    groups.  Sliding-window tables hold their nulls as one prefix (hits are
    padded at the front, releases walk back to the last null), which the
    window bound relies on and checks at its edge.
    """
    size = state.geometry.page_size
    requests = state.requests
    need_hi = main_hi = cache_hi = remove_hi = FOREVER
    cache_lo = cache_upto
    if layout.caching:
        least = FOREVER  # the fewest cached blocks of any group (a loop: no generator frame)
        for cursor in cursors:
            cached = cursor.cached
            if cached is None:
                least = 0
                break
            if cached.num_cached < least:
                least = cached.num_cached
        cache_hi = (least + 1) * size - 1  # no newly full block to cache
        prompt = (request.num_prompt_tokens - 1) // size * size
        if layout.has_mamba and prompt > 0 and cache_upto < prompt + size and \
                _prompt_state_lost(state, layout, holders, prompt // size - 1):
            if cache_upto >= prompt:
                return None  # the prompt's state would be cached again
            cache_hi = min(cache_hi, prompt - 1)
    for rule, holder, cursor in zip(layout.rules, holders, cursors, strict=True):
        record = requests.get(holder)
        if record is None:
            return None
        table = record.pages
        length = len(table)
        if rule.kind == MAMBA:
            main_hi = min(main_hi, length * size)
            if cursor.retired < length:  # states past ``retired`` would be retired
                remove_hi = min(remove_hi, (cursor.retired + 1) * size)
            continue
        need_hi = min(need_hi, length * size)
        if rule.kind == SWA:
            nulls = _null_prefix(table, _skipped_count(rule, remove_upto, size))
            if nulls is None:
                return None
            if nulls < length:  # block ``nulls`` is the next to leave the window
                remove_hi = min(remove_hi, (nulls + 1) * size + rule.extra_retained +
                                rule.window - 2)
    return need_hi, main_hi, cache_lo, cache_hi, remove_hi


def _prompt_state_lost(state: Any, layout: HybridLayout, holders: Sequence[str],
                       index: int) -> bool:
    """Whether a Mamba group's table holds a real block at ``index`` (the prompt's last state)
    that is no longer cached (``step_is_idle``'s prompt-state test)."""
    requests = state.requests
    for rule, holder in zip(layout.rules, holders, strict=True):
        record = requests.get(holder)
        if rule.kind == MAMBA and record is not None and 0 <= index < len(record.pages):
            page = record.pages[index]
            if page != NULL and page not in state.page_node:
                return True
    return False


def _skipped_count(rule: Any, upto: int, size: int) -> int:
    """The blocks a sliding-window group no longer reads at ``upto`` computed tokens (the step
    that just ran made them null, or found them null)."""
    skipped = upto - rule.extra_retained - rule.window + 1
    return skipped // size if skipped >= size else 0


def _null_prefix(table: Sequence[int], start: int) -> int | None:
    """The length of the table's leading run of nulls, walked from ``start`` (the run is
    known to cover ``start`` entries only when entry ``start - 1`` is null; None if not)."""
    start = min(start, len(table))
    if start and table[start - 1] != NULL:
        return None
    index = start
    while index < len(table) and table[index] == NULL:
        index += 1
    return index
