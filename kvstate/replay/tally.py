"""The replay summary and its per-event counters, defined once for every front end.

Prompt accounting (the same definitions in the text summary, ``--json``,
replay/README.md and docs/log-format.md):

* a request's **prefill** runs from its ``ReqAlloc`` to its first write of
  KV it computes itself.  Every slot written into its table during the
  prefill is one of its **prompt tokens**, counted when that first computed
  write comes (a request closed before it, an admission undone, counts
  nothing: it was never admitted);
* a prompt slot whose KV was already there is a **prefix hit**: a slot of a
  tree page written by ``Assign``, any slot mapped by ``Share`` (held KV), a
  cached block taken by ``BlockHold``;
* the other prompt slots are **computed** (misses): fresh or own pages
  written by ``Assign``/``Scatter``, the slots of an ``Allocate`` item, the
  blocks of a ``BlockAlloc``.  The write that contains the first computed
  slot ends the prefill (later writes are decode);
* ``prefix_hit_rate = prefix_hit_tokens / prompt_tokens``.

This holds whichever front end made the log: the planner's
``Assign`` + ``Allocate(items)``, the SGLang objects' ``alloc`` +
``pool.write`` + ``cache_finished_req`` (``Allocate`` without items, then
``Assign`` of its slots), vLLM's ``BlockHold`` + ``BlockAlloc``.  Units:
block mode counts whole blocks (a computed prompt's last block counts
whole), and a log whose header ``meta`` says ``tokens_per_slot: N`` (a
simulation that models N tokens as one slot) has every token count
multiplied by N; ``granularity`` says which.  A chunked prefill counts its
first chunk only.  Mutated only by the replay that owns it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from kvstate.events import (
    Allocate,
    Assign,
    BlockAlloc,
    BlockHold,
    BlockUncache,
    Evict,
    Load,
    ReqAlloc,
    ReqFree,
    Scatter,
    Share,
)


@attrs.define
class Summary:
    """Counts gathered while replaying (cheap per event)."""

    events: int = 0
    by_type: dict[str, int] = attrs.field(factory=dict)
    requests: int = 0
    peak_pages_used: int = 0
    hit_units: int = 0  # prompt slots (block mode: blocks) that were prefix hits
    computed_units: int = 0  # prompt slots (blocks) computed
    unit_tokens: int = 1  # tokens per counted unit (see the module docstring)
    granularity: str = "token"
    evictions: int = 0  # Evict events
    evicted_nodes: int = 0
    evicted_units: int = 0
    block_hits: int = 0  # block mode: cached blocks a request took (vLLM prefix hits, BlockHold)
    blocks_allocated: int = 0  # block mode: blocks taken from the free queue (BlockAlloc)
    blocks_uncached: int = 0  # block mode: cached blocks evicted (BlockUncache, lazy eviction)
    checkpoints_verified: int = 0
    digests: str = "unverified"  # verified | broken | unverified (a format 1 log has none)
    digests_verified: int = 0
    invariant_checks: int = 0
    seconds: float = 0.0
    final_fingerprint: str = ""

    @property
    def prefix_hit_tokens(self) -> int:
        return self.hit_units * self.unit_tokens

    @property
    def computed_prompt_tokens(self) -> int:
        return self.computed_units * self.unit_tokens

    @property
    def prompt_tokens(self) -> int:
        return self.prefix_hit_tokens + self.computed_prompt_tokens

    @property
    def prefix_hit_rate(self) -> float:
        prompt = self.prompt_tokens
        return self.prefix_hit_tokens / prompt if prompt else 0.0

    @property
    def evicted_tokens(self) -> int:
        return self.evicted_units * self.unit_tokens

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "events": self.events, "by_type": dict(sorted(self.by_type.items())),
            "requests": self.requests, "peak_pages_used": self.peak_pages_used,
            "prompt_tokens": self.prompt_tokens, "prefix_hit_tokens": self.prefix_hit_tokens,
            "computed_prompt_tokens": self.computed_prompt_tokens,
            "prefix_hit_rate": round(self.prefix_hit_rate, 6), "granularity": self.granularity,
            "evictions": self.evictions,
            "evicted_nodes": self.evicted_nodes, "evicted_tokens": self.evicted_tokens,
            "block_hits": self.block_hits, "blocks_allocated": self.blocks_allocated,
            "blocks_uncached": self.blocks_uncached,
            "checkpoints_verified": self.checkpoints_verified,
            "digests": self.digests, "digests_verified": self.digests_verified,
            "invariant_checks": self.invariant_checks,
            "seconds": round(self.seconds, 6), "events_per_second": round(self.events_per_second, 1),
            "final_fingerprint": self.final_fingerprint,
        }


def set_units(summary: Summary, page_size: int, block_mode: bool, tokens_per_slot: int) -> None:
    """Fix the summary's unit from the log's geometry and its ``meta.tokens_per_slot``."""
    unit = (page_size if block_mode else 1) * tokens_per_slot
    summary.unit_tokens = unit
    if block_mode:
        summary.granularity = f"block of {unit} tokens"
    elif tokens_per_slot > 1:
        summary.granularity = f"slot of {tokens_per_slot} tokens"


# -- before the event: split a prefill write into hits and computed slots -----------------
Writes = list[tuple[Any, int, int]]  # (request in its prefill, hit units, computed units)


def _split(state: Any, slots: Any) -> tuple[int, int]:
    size, tree = state.geometry.page_size, state.page_node
    hits = 0
    for slot in slots:  # hits are the tree slots before the first computed one
        if slot // size not in tree:
            break
        hits += 1
    return hits, len(slots) - hits


def _assign(state: Any, evt: Any, pending: dict[Any, int]) -> Writes | None:
    if evt.request not in pending:
        return None
    if type(evt) is Share:  # held KV mapped again: every slot is a hit
        return [(evt.request, len(evt.slots), 0)]
    return [(evt.request, *_split(state, evt.slots))]


def _scatter(state: Any, evt: Any, pending: dict[Any, int]) -> Writes | None:
    writes = [(request, *_split(state, (slot,))) for request, _, slot in evt.items
              if request in pending]
    return writes or None


def _allocate(state: Any, evt: Any, pending: dict[Any, int]) -> Writes | None:
    writes = [(request, 0, len(slots)) for request, slots in evt.items if request in pending]
    return writes or None


def _hold_split(state: Any, evt: Any, pending: dict[Any, int]) -> Writes | None:
    if evt.holder not in pending:
        return None
    return [(evt.holder, sum(1 for page in evt.pages if page), 0)]  # page 0 pads, not a hit


def _alloc_split(state: Any, evt: Any, pending: dict[Any, int]) -> Writes | None:
    return [(evt.holder, 0, len(evt.pages))] if evt.holder in pending else None


def _evicted(state: Any, evt: Any, pending: dict[Any, int]) -> int:
    nodes = state.nodes
    return sum(len(nodes[n].key) for n in evt.nodes if n in nodes)


_BEFORE: dict[type, Callable[[Any, Any, dict[Any, int]], Any]] = {
    Assign: _assign, Share: _assign, Scatter: _scatter, Allocate: _allocate,
    BlockHold: _hold_split, BlockAlloc: _alloc_split, Evict: _evicted,
}


# -- after the event was accepted -----------------------------------------------------
def _count_prompt(summary: Summary, pending: dict[Any, int], evt: Any,
                  writes: Writes | None) -> None:
    """Hits wait in ``pending`` until the request computes its first slot (then its prompt
    counts); a request closed before that was never admitted and counts nothing."""
    if writes is None:
        return
    for request, hits, computed in writes:
        if request not in pending:  # an earlier item of this event ended its prefill
            continue
        if computed:
            summary.hit_units += pending.pop(request) + hits
            summary.computed_units += computed
        else:
            pending[request] += hits


def _req_alloc(summary: Summary, pending: dict[Any, int], evt: Any, _: Any) -> None:
    summary.requests += len(evt.requests)
    for request in evt.requests:
        pending[request] = 0


def _req_free(summary: Summary, pending: dict[Any, int], evt: Any, _: Any) -> None:
    for request in evt.requests:
        pending.pop(request, None)


def _evict(summary: Summary, _: dict[Any, int], evt: Any, evicted: int) -> None:
    summary.evictions += 1
    summary.evicted_nodes += len(evt.nodes)
    summary.evicted_units += evicted


def _block_hold(summary: Summary, pending: dict[Any, int], evt: Any, split: Writes | None) -> None:
    summary.block_hits += sum(1 for page in evt.pages if page)
    _count_prompt(summary, pending, evt, split)


def _block_alloc(summary: Summary, pending: dict[Any, int], evt: Any, split: Writes | None) -> None:
    summary.blocks_allocated += len(evt.pages)
    _count_prompt(summary, pending, evt, split)


def _block_uncache(summary: Summary, _: dict[Any, int], evt: Any, __: Any) -> None:
    summary.blocks_uncached += len(evt.pages)


_AFTER: dict[type, Callable[[Summary, dict[Any, int], Any, Any], None]] = {
    Allocate: _count_prompt, Assign: _count_prompt, Share: _count_prompt,
    Scatter: _count_prompt, ReqAlloc: _req_alloc, ReqFree: _req_free, Evict: _evict,
    BlockHold: _block_hold, BlockAlloc: _block_alloc, BlockUncache: _block_uncache,
}


# The only events that take pages off the device free list: the peak can only move
# after one of them, so the free list's length is read only then (it costs about a
# microsecond on the live backend, as much as a small event's rule).
TAKES_PAGES = frozenset({Allocate, BlockAlloc, BlockHold, Load})


@attrs.frozen
class Hook:
    """What the summary does around one event kind: ``before(state, event, pending)``
    measures the state before the event, ``after(summary, pending, event, measured)``
    counts it once applied, ``takes_pages`` asks for the free list's length after it."""

    before: Callable[[Any, Any, dict[Any, int]], Any] | None
    after: Callable[[Summary, dict[Any, int], Any, Any], None] | None
    takes_pages: bool


# Event kind -> its hook; kinds not listed only count in ``by_type``.  The replay loop
# reads this table once per event instead of calling two functions for every event.
HOOKS: dict[type, Hook] = {
    kind: Hook(_BEFORE.get(kind), _AFTER.get(kind), kind in TAKES_PAGES)
    for kind in {*_BEFORE, *_AFTER, *TAKES_PAGES}
}


def record_peak(summary: Summary, state: Any, num_pages: int) -> None:
    """After an event that takes pages: raise the peak of pages in use if it grew."""
    used = num_pages - len(state.free_pages)
    if used > summary.peak_pages_used:
        summary.peak_pages_used = used


def add_type_counts(summary: Summary, counts: dict[Any, int]) -> None:
    """Fold the replay loop's per-class event counts into ``by_type`` (by tag)."""
    by_type = summary.by_type
    for kind, count in counts.items():
        by_type[kind.TAG] = by_type.get(kind.TAG, 0) + count
