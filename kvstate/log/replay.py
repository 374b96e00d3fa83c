"""Replaying a log: the pure reducer over its events, with invariant and fingerprint checks.

``replay(reader)`` folds ``kvstate.reducer.apply`` over the log's events from
``initial_state(header.geometry)``, runs the invariant checks every
``check_every`` events (and on the final state), verifies each checkpoint and
the end record's fingerprint, and stops at the first failure.  It returns a
``ReplayResult``: the final state, a ``Summary`` of what happened and, on
failure, a ``ReplayFailure`` naming the kind, the event index, the event and
the violated check (or the byte offset of a malformed record).

Failure kinds: ``invariant`` (a check failed), ``invalid_event`` (the
reducer refused an event), ``fingerprint`` (a checkpoint or the end record
disagrees with the replayed state), ``format`` (malformed bytes), and
``executor`` (a data-plane hook reported a problem).  The replay owns only
its local counters; the reader is consumed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs

from kvstate.errors import InvalidEvent
from kvstate.events import Event
from kvstate.invariants import Violation, check
from kvstate.log.format import Checkpoint, EndRecord, LogFormatError, LogHeader
from kvstate.log.initial import Applier, ReplayState, applier, core_of, start_state, with_host_checks
from kvstate.log.reader import LogReader
from kvstate.log.replay_fast import FAST_MIN_INTERVAL, run_transient
from kvstate.log.tally import count_after, measure_before
from kvstate.state import State

Checker = Callable[[State], list[Violation]]
EventHook = Callable[[int, Event, State], None]


@attrs.frozen
class ReplayFailure:
    """Why a replay stopped.  ``event_index`` is 0-based over the log's events."""

    kind: str
    message: str
    event_index: int | None = None
    event: Event | None = None
    check: str | None = None
    byte_offset: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "message": self.message}
        if self.event_index is not None:
            out["event_index"] = self.event_index
        if self.byte_offset is not None:
            out["byte_offset"] = self.byte_offset
        if self.check is not None:
            out["check"] = self.check
        if self.event is not None:
            out["event"] = repr(self.event)
        return out

    def describe(self) -> str:
        if self.kind == "format":
            return f"malformed log at byte {self.byte_offset}: {self.message}"
        where = f"event #{self.event_index}" if self.event_index is not None else "log"
        shown = f" {self.event!r}" if self.event is not None else ""
        return f"{self.kind} failure at {where}{shown}: [{self.check}] {self.message}"


@attrs.define
class Summary:
    """Counts gathered while replaying (cheap per event; mutated only by ``replay``)."""

    events: int = 0
    by_type: dict[str, int] = attrs.field(factory=dict)
    requests: int = 0
    peak_pages_used: int = 0
    prefix_hit_tokens: int = 0
    prefill_tokens: int = 0  # tokens newly allocated by each request's first extend
    evictions: int = 0  # Evict events
    evicted_nodes: int = 0
    evicted_tokens: int = 0
    block_hits: int = 0  # block mode: cached blocks a request took (vLLM prefix hits, BlockHold)
    blocks_allocated: int = 0  # block mode: blocks taken from the free queue (BlockAlloc)
    blocks_uncached: int = 0  # block mode: cached blocks evicted (BlockUncache, lazy eviction)
    checkpoints_verified: int = 0
    invariant_checks: int = 0
    seconds: float = 0.0
    final_fingerprint: str = ""

    @property
    def prefix_hit_rate(self) -> float:
        total = self.prefix_hit_tokens + self.prefill_tokens
        return self.prefix_hit_tokens / total if total else 0.0

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "events": self.events, "by_type": dict(sorted(self.by_type.items())),
            "requests": self.requests, "peak_pages_used": self.peak_pages_used,
            "prefix_hit_tokens": self.prefix_hit_tokens, "prefill_tokens": self.prefill_tokens,
            "prefix_hit_rate": round(self.prefix_hit_rate, 6), "evictions": self.evictions,
            "evicted_nodes": self.evicted_nodes, "evicted_tokens": self.evicted_tokens,
            "block_hits": self.block_hits, "blocks_allocated": self.blocks_allocated,
            "blocks_uncached": self.blocks_uncached,
            "checkpoints_verified": self.checkpoints_verified,
            "invariant_checks": self.invariant_checks,
            "seconds": round(self.seconds, 6), "events_per_second": round(self.events_per_second, 1),
            "final_fingerprint": self.final_fingerprint,
        }


@attrs.define
class ReplayResult:
    header: LogHeader
    state: ReplayState  # a TieredState when the log has a host tier (header.host_pages)
    summary: Summary
    failure: ReplayFailure | None = None
    stopped_early: bool = False  # --until reached before the end record
    salvaged: LogFormatError | None = None  # salvage mode: where reading stopped
    reducer: str = "pure"  # "transient" when the fast path replayed it

    @property
    def ok(self) -> bool:
        return self.failure is None


def replay(reader: LogReader, *, check_every: int = 1, until: int | None = None,
           checker: Checker = check, verify: bool = True, on_event: EventHook | None = None,
           on_progress: Callable[[int, int], None] | None = None,
           progress_every: int = 4096, fast: bool | None = None) -> ReplayResult:
    """Replay ``reader``'s log; see the module docstring.  ``check_every=0`` never checks.

    ``fast`` picks the transient fast path (``kvstate.log.replay_fast``); the
    default (``None``) takes it whenever it gives the same answers: a log
    without a host tier (radix or block mode), no ``on_event`` hook, and checks every
    ``FAST_MIN_INTERVAL`` events or fewer.  ``fast=True`` where it cannot be
    used is a ``ValueError``.
    """
    header = reader.header
    state = start_state(header)
    summary = Summary()
    result = ReplayResult(header, state, summary)
    started = time.perf_counter()
    if verify and header.initial_fingerprint and header.initial_fingerprint != state.fingerprint():
        result.failure = ReplayFailure(
            "fingerprint", "the initial state's fingerprint differs from the header's (the state "
            "encoding changed since this log was written)", check="initial_state")
    else:
        usable = isinstance(state, State) and on_event is None
        if fast and not usable:
            raise ValueError("the fast replay path needs a log without a host tier and no "
                             "on_event hook")
        if fast is None:
            fast = usable and (check_every == 0 or check_every >= FAST_MIN_INTERVAL)
        if fast:
            result.reducer = "transient"
            state = run_transient(reader, result, state, check_every, until,  # type: ignore[arg-type]
                                  checker, verify, on_progress, progress_every)
        else:
            state = _run(reader, result, state, applier(header), check_every, until,
                         with_host_checks(checker), verify, on_event, on_progress, progress_every)
    result.state = state
    summary.seconds = time.perf_counter() - started
    summary.final_fingerprint = state.fingerprint().hex()
    result.salvaged = reader.stopped
    return result


def _run(reader: LogReader, result: ReplayResult, state: ReplayState,
         apply: Applier, check_every: int, until: int | None,
         checker: Callable[[ReplayState], list[Violation]], verify: bool,
         on_event: EventHook | None, on_progress: Callable[[int, int], None] | None,
         progress_every: int) -> ReplayState:
    summary = result.summary
    index = 0
    last_checked = 0
    num_pages = core_of(state).geometry.num_pages
    pending: set[Any] = set()  # requests still waiting for their first allocation
    last: Event | None = None
    try:
        for offset, item in reader.records():
            if isinstance(item, Event):
                if until is not None and index >= until:
                    result.stopped_early = True
                    break
                measure = measure_before(core_of(state), item)
                try:
                    after = apply(state, item)
                except InvalidEvent as exc:
                    summary.events = index
                    result.failure = ReplayFailure("invalid_event", exc.precondition, index, item,
                                                   "reducer", offset)
                    return state
                count_after(summary, pending, item, measure,
                            num_pages - len(core_of(after).free_pages))
                state = after
                last = item
                index += 1
                if on_event is not None:
                    on_event(index - 1, item, core_of(state))
                if check_every and index % check_every == 0:
                    last_checked = index
                    if violated(result, checker, state, index - 1, item, offset):
                        summary.events = index
                        return state
                if on_progress is not None and index % progress_every == 0:
                    on_progress(index, reader.offset)
            elif verify and isinstance(item, (Checkpoint, EndRecord)):
                expected = item.fingerprint
                if state.fingerprint() != expected:
                    what = "end record" if isinstance(item, EndRecord) else f"checkpoint at {index}"
                    summary.events = index
                    result.failure = ReplayFailure(
                        "fingerprint", f"{what}: log says {expected.hex()}, replay has "
                        f"{state.fingerprint().hex()}", index - 1 if index else None, None,
                        "end" if isinstance(item, EndRecord) else "checkpoint", offset)
                    return state
                summary.checkpoints_verified += isinstance(item, Checkpoint)
    except LogFormatError as exc:
        summary.events = index
        result.failure = ReplayFailure("format", exc.reason, index, None, None, exc.offset)
        return state
    summary.events = index
    if check_every and last_checked != index and index:
        violated(result, checker, state, index - 1, last, None)
    return state


def violated(result: ReplayResult, checker: Callable[[ReplayState], list[Violation]],
              state: ReplayState, index: int,
              evt: Event | None, offset: int | None) -> bool:
    result.summary.invariant_checks += 1
    violations = checker(state)
    if not violations:
        return False
    first = violations[0]
    more = f" (+{len(violations) - 1} more)" if len(violations) > 1 else ""
    result.failure = ReplayFailure("invariant", first.message + more, index, evt, first.check, offset)
    return True


def replay_path(path: str, **options: Any) -> ReplayResult:
    """Open, replay and close a log; ``salvage=`` goes to the reader, the rest to :func:`replay`."""
    salvage = bool(options.pop("salvage", False))
    with LogReader(path, salvage=salvage) as reader:
        return replay(reader, **options)
