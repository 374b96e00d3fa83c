"""The replay loop on the transient fast path (``kvstate.transient``).

Same results as the pure loop in ``kvstate.log.replay`` (same summary, same
failures, same final state), used when nothing needs a frozen state after
every event: no per-event hook and invariant checks thinned to every
``FAST_MIN_INTERVAL`` events or more.  The state is frozen only at
checkpoints, invariant checks and the end.  The summary counters read the
transient state directly; the ones that depend on the state before an event
(prefix hits, evicted tokens) are measured before it is applied and counted
only once it is accepted.  Radix and block-mode (vLLM) logs both take it;
host-tier logs do not.  Owns nothing but its local counters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvstate.errors import InvalidEvent
from kvstate.events import Allocate, Assign, Event, Evict, ReqAlloc, Share
from kvstate.events_block import BlockAlloc, BlockHold, BlockUncache
from kvstate.log.format import Checkpoint, EndRecord, LogFormatError
from kvstate.log.reader import LogReader
from kvstate.state import State
from kvstate.transient import TransientApplier, TransientState

if TYPE_CHECKING:
    from kvstate.invariants import Violation
    from kvstate.log.replay import ReplayResult, Summary

FAST_MIN_INTERVAL = 64  # thinner checks than this would freeze too often to pay off


def _hit_tokens(ts: TransientState, evt: Any) -> int:
    """Prompt tokens a request's first write found in the tree (before the write)."""
    record = ts.requests.get(evt.request)
    if evt.start or record is None or record.allocated:
        return 0
    size, tree = ts.geometry.page_size, ts.page_node
    return sum(1 for slot in evt.slots if slot // size in tree)


def _evicted_tokens(ts: TransientState, evt: Any) -> int:
    nodes = ts.nodes
    return sum(len(nodes[n].key) for n in evt.nodes if n in nodes)


PRE: dict[type[Event], Callable[[TransientState, Any], int]] = {
    Assign: _hit_tokens, Share: _hit_tokens, Evict: _evicted_tokens,
}


def _count_allocate(summary: Summary, pending: set[Any], evt: Any, _: int) -> None:
    if pending:
        for request_id, slots in evt.items:
            if request_id in pending:
                pending.discard(request_id)
                summary.prefill_tokens += len(slots)


def _count_req_alloc(summary: Summary, pending: set[Any], evt: Any, _: int) -> None:
    summary.requests += len(evt.requests)
    pending.update(evt.requests)


def _count_hits(summary: Summary, _: set[Any], __: Any, hit_tokens: int) -> None:
    summary.prefix_hit_tokens += hit_tokens


def _count_evict(summary: Summary, _: set[Any], evt: Any, evicted_tokens: int) -> None:
    summary.evictions += 1
    summary.evicted_nodes += len(evt.nodes)
    summary.evicted_tokens += evicted_tokens


def _count_block_hits(summary: Summary, _: set[Any], evt: Any, __: int) -> None:
    summary.block_hits += sum(1 for page in evt.pages if page)  # page 0 pads, not a hit


def _count_block_alloc(summary: Summary, _: set[Any], evt: Any, __: int) -> None:
    summary.blocks_allocated += len(evt.pages)


def _count_block_uncache(summary: Summary, _: set[Any], evt: Any, __: int) -> None:
    summary.blocks_uncached += len(evt.pages)


POST: dict[type[Event], Callable[[Summary, set[Any], Any, int], None]] = {
    Allocate: _count_allocate, ReqAlloc: _count_req_alloc, Assign: _count_hits,
    Share: _count_hits, Evict: _count_evict, BlockHold: _count_block_hits,
    BlockAlloc: _count_block_alloc, BlockUncache: _count_block_uncache,
}
TAKES_PAGES = frozenset({Allocate, BlockAlloc, BlockHold})  # events that can shrink the free queue


def run_transient(reader: LogReader, result: ReplayResult, state: State, check_every: int,
                  until: int | None, checker: Callable[[Any], list[Violation]], verify: bool,
                  on_progress: Callable[[int, int], None] | None, progress_every: int) -> State:
    """Replay the rest of ``reader`` from ``state``; fills ``result``, returns the final state."""
    from kvstate.log.replay import ReplayFailure, violated

    summary = result.summary
    applier = TransientApplier(state)
    ts = applier.transient
    num_pages = state.geometry.num_pages
    pending: set[Any] = set()  # requests still waiting for their first Allocate
    counts: dict[Any, int] = {}  # event class -> events applied
    index = last_checked = 0
    last: Event | None = None
    pre_get, post_get, rule_get = PRE.get, POST.get, applier.rules.get
    try:
        for offset, item in reader.records():
            kind = type(item)
            if kind is Checkpoint or kind is EndRecord:
                if verify:
                    expected = item.fingerprint  # type: ignore[union-attr]
                    got = applier.state().fingerprint()
                    if got != expected:
                        what = "end record" if kind is EndRecord else f"checkpoint at {index}"
                        result.failure = ReplayFailure(
                            "fingerprint", f"{what}: log says {expected.hex()}, replay has "
                            f"{got.hex()}", index - 1 if index else None, None,
                            "end" if kind is EndRecord else "checkpoint", offset)
                        break
                    summary.checkpoints_verified += kind is Checkpoint
                continue
            if until is not None and index >= until:
                result.stopped_early = True
                break
            pre = pre_get(kind)  # type: ignore[arg-type]
            measure = pre(ts, item) if pre is not None else 0
            rule = rule_get(kind)  # type: ignore[arg-type]
            if rule is not None and rule(ts, item):
                ts.seq += 1
            else:
                try:
                    applier.apply_declined(item)  # type: ignore[arg-type]
                except InvalidEvent as exc:
                    result.failure = ReplayFailure("invalid_event", exc.precondition, index,
                                                   item, "reducer", offset)  # type: ignore[arg-type]
                    break
                ts = applier.transient
                pages_used = num_pages - len(ts.free_pages)  # a fallback may take pages
                summary.peak_pages_used = max(summary.peak_pages_used, pages_used)
            counts[kind] = counts.get(kind, 0) + 1
            post = post_get(kind)  # type: ignore[arg-type]
            if post is not None:
                post(summary, pending, item, measure)
                if kind in TAKES_PAGES:  # only these take pages off the free list
                    pages_used = num_pages - len(ts.free_pages)
                    if pages_used > summary.peak_pages_used:
                        summary.peak_pages_used = pages_used
            last = item  # type: ignore[assignment]
            index += 1
            if check_every and index % check_every == 0:
                last_checked = index
                if violated(result, checker, applier.state(), index - 1, last, offset):
                    break
            if on_progress is not None and index % progress_every == 0:
                on_progress(index, reader.offset)
    except LogFormatError as exc:
        result.failure = ReplayFailure("format", exc.reason, index, None, None, exc.offset)
    else:
        if result.failure is None and check_every and last_checked != index and index:
            violated(result, checker, applier.state(), index - 1, last, None)
    summary.events = index
    by_type = summary.by_type
    for kind, count in counts.items():
        tag = kind.TAG
        by_type[tag] = by_type.get(tag, 0) + count
    return applier.state()
