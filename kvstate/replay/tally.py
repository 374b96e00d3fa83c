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


# -- before the event: what only the state before it shows --------------------------------
Writes = list[tuple[Any, int, int]]  # (request in its prefill, hit units, computed units)


def _split(state: Any, slots: Any) -> tuple[int, int]:
    size, tree = state.geometry.page_size, state.page_node
    hits = 0
    for slot in slots:  # hits are the tree slots before the first computed one
        if slot // size not in tree:
            break
        hits += 1
    return hits, len(slots) - hits


def _assign_split(state: Any, evt: Any, pending: dict[Any, int]) -> Writes | None:
    if evt.request not in pending:
        return None
    return [(evt.request, *_split(state, evt.slots))]


def _scatter_split(state: Any, evt: Any, pending: dict[Any, int]) -> Writes | None:
    writes = [(request, *_split(state, (slot,))) for request, _, slot in evt.items
              if request in pending]
    return writes or None


def _evicted(state: Any, evt: Any, pending: dict[Any, int]) -> int:
    nodes = state.nodes
    return sum(len(nodes[n].key) for n in evt.nodes if n in nodes)


# -- after the event was accepted: (summary, pending, event, measured, state) -------------
def _prompt(summary: Summary, pending: dict[Any, int], request: Any, hits: int,
            computed: int) -> None:
    """One prefill write of ``request`` (in ``pending``).  Hits wait in ``pending`` until the
    request computes its first slot (then its prompt counts); a request closed before that
    was never admitted and counts nothing."""
    if computed:
        summary.hit_units += pending.pop(request) + hits
        summary.computed_units += computed
    else:
        pending[request] += hits


def _peak(summary: Summary, state: Any) -> None:
    """After an event that takes pages: raise the peak of pages in use if it grew.  Only
    ``Allocate``, ``BlockAlloc``, ``BlockHold`` and ``Load`` take pages off the device free
    list, so only their hooks read its length (about a microsecond on the live backend, as
    much as a small event's rule)."""
    used = state.geometry.num_pages - len(state.free_pages)
    if used > summary.peak_pages_used:
        summary.peak_pages_used = used


def _writes(summary: Summary, pending: dict[Any, int], evt: Any, writes: Writes | None,
            state: Any) -> None:
    if writes is None:
        return
    for request, hits, computed in writes:
        if request in pending:  # not when an earlier item of this event ended its prefill
            _prompt(summary, pending, request, hits, computed)


def _share(summary: Summary, pending: dict[Any, int], evt: Any, _: Any, state: Any) -> None:
    if evt.request in pending:  # held KV mapped again: every slot is a hit
        _prompt(summary, pending, evt.request, len(evt.slots), 0)


def _allocate(summary: Summary, pending: dict[Any, int], evt: Any, _: Any, state: Any) -> None:
    for request, slots in evt.items:
        if request in pending:
            _prompt(summary, pending, request, 0, len(slots))
    _peak(summary, state)


def _req_alloc(summary: Summary, pending: dict[Any, int], evt: Any, _: Any, state: Any) -> None:
    summary.requests += len(evt.requests)
    for request in evt.requests:
        pending[request] = 0


def _req_free(summary: Summary, pending: dict[Any, int], evt: Any, _: Any, state: Any) -> None:
    for request in evt.requests:
        pending.pop(request, None)


def _evict(summary: Summary, _: dict[Any, int], evt: Any, evicted: int, state: Any) -> None:
    summary.evictions += 1
    summary.evicted_nodes += len(evt.nodes)
    summary.evicted_units += evicted


def _block_hold(summary: Summary, pending: dict[Any, int], evt: Any, _: Any, state: Any) -> None:
    pages, holder = evt.pages, evt.holder
    hits = len(pages) - pages.count(0)  # page 0 pads a table and is not a hit
    summary.block_hits += hits
    if holder in pending:  # hits only: the prefill goes on (``_prompt`` with none computed)
        pending[holder] += hits
    _peak(summary, state)


def _block_alloc(summary: Summary, pending: dict[Any, int], evt: Any, _: Any, state: Any) -> None:
    computed, holder = len(evt.pages), evt.holder
    summary.blocks_allocated += computed
    if computed and holder in pending:  # the first computed blocks end the prefill (``_prompt``)
        summary.hit_units += pending.pop(holder)
        summary.computed_units += computed
    _peak(summary, state)


def _block_uncache(summary: Summary, _: dict[Any, int], evt: Any, __: Any, state: Any) -> None:
    summary.blocks_uncached += len(evt.pages)


def _load(summary: Summary, _: dict[Any, int], evt: Any, __: Any, state: Any) -> None:
    _peak(summary, state)


Before = Callable[[Any, Any, dict[Any, int]], Any]
After = Callable[[Summary, dict[Any, int], Any, Any, Any], None]

# Event kind -> (before, after): ``before(state, event, pending)`` measures the state before
# the event (None when the count needs only the event), ``after(summary, pending, event,
# measured, state)`` counts it once applied.  Kinds not listed only count in ``by_type``.
# One table lookup and at most two calls per event: the replay loop's whole summary cost.
HOOKS: dict[type, tuple[Before | None, After]] = {
    Assign: (_assign_split, _writes), Scatter: (_scatter_split, _writes),
    Evict: (_evicted, _evict), Share: (None, _share), Allocate: (None, _allocate),
    ReqAlloc: (None, _req_alloc), ReqFree: (None, _req_free),
    BlockHold: (None, _block_hold), BlockAlloc: (None, _block_alloc),
    BlockUncache: (None, _block_uncache), Load: (None, _load),
}


def add_type_counts(summary: Summary, counts: dict[Any, int]) -> None:
    """Fold the replay loop's per-class event counts into ``by_type`` (by tag)."""
    by_type = summary.by_type
    for kind, count in counts.items():
        by_type[kind.TAG] = by_type.get(kind.TAG, 0) + count
