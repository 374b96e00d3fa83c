"""Replaying a log: its events through the rules, with invariant and fingerprint checks.

``replay(reader)`` applies the log's events from the header's initial state
on the live backend (or, with ``backend="persistent"``, on frozen states),
checks the invariants every ``check_every`` events (and on the final state),
verifies each checkpoint and the end record's fingerprint, and stops at the
first failure.  Checks on the live backend are incremental
(``kvstate.invariants.incremental``): they look only at what changed since
the last check, so checking after every event costs what the events touch,
not the size of the state; ``full_checks=True`` runs the from-scratch checks
instead.  It returns a ``ReplayResult``: the final state, a ``Summary`` of
what happened and, on failure, a ``ReplayFailure`` naming the kind, the
event index, the event and the violated check (or the byte offset of a
malformed record).

Failure kinds: ``invariant`` (a check failed), ``invalid_event`` (the rules
refused an event), ``fingerprint`` (a checkpoint or the end record
disagrees with the replayed state), ``format`` (malformed bytes), and
``executor`` (a data-plane hook reported a problem).  The replay owns only
its local counters and state; the reader is consumed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs

from kvstate.backends.live import LiveState
from kvstate.backends.persistent import apply_valid
from kvstate.canonical import fingerprint
from kvstate.errors import InvalidEvent
from kvstate.events import Event
from kvstate.invariants import Violation, check
from kvstate.invariants.incremental import IncrementalChecker
from kvstate.log.format import Checkpoint, EndRecord, LogFormatError, LogHeader
from kvstate.log.reader import LogReader
from kvstate.replay.tally import count_after, measure_before
from kvstate.state import State, initial_state

Checker = Callable[[Any], list[Violation]]
EventHook = Callable[[int, Event, Any], None]
BACKENDS = ("live", "persistent")


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
    state: State  # the final state, frozen
    summary: Summary
    failure: ReplayFailure | None = None
    stopped_early: bool = False  # --until reached before the end record
    salvaged: LogFormatError | None = None  # salvage mode: where reading stopped
    backend: str = "live"

    @property
    def ok(self) -> bool:
        return self.failure is None


def start_state(header: LogHeader) -> State:
    """The state before the log's first event."""
    return initial_state(header.geometry, host_pages=header.host_pages)


def replay(reader: LogReader, *, check_every: int = 1, until: int | None = None,
           checker: Checker | None = None, verify: bool = True,
           on_event: EventHook | None = None,
           on_progress: Callable[[int, int], None] | None = None,
           progress_every: int = 4096, backend: str = "live",
           full_checks: bool = False) -> ReplayResult:
    """Replay ``reader``'s log; see the module docstring.  ``check_every=0`` never checks.

    ``checker`` replaces the invariant checks (it then runs from scratch on
    the state at each check); ``on_event(index, event, view)`` is called
    after each applied event.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    header = reader.header
    initial = start_state(header)
    summary = Summary()
    result = ReplayResult(header, initial, summary, backend=backend)
    started = time.perf_counter()
    if verify and header.initial_fingerprint and header.initial_fingerprint != initial.fingerprint():
        result.failure = ReplayFailure(
            "fingerprint", "the initial state's fingerprint differs from the header's (the state "
            "encoding changed since this log was written)", check="initial_state")
        final: Any = initial
    else:
        loop = _Loop(result, initial, backend, check_every, checker, full_checks)
        final = loop.run(reader, until, verify, on_event, on_progress, progress_every)
    result.state = final if isinstance(final, State) else final.freeze()
    summary.seconds = time.perf_counter() - started
    summary.final_fingerprint = fingerprint(final).hex()
    result.salvaged = reader.stopped
    return result


class _Loop:
    """One replay: the state (live or frozen), its checker and the counters."""

    def __init__(self, result: ReplayResult, initial: State, backend: str, check_every: int,
                 checker: Checker | None, full_checks: bool) -> None:
        self.result = result
        self.persistent = backend == "persistent"
        self.state: Any = initial if self.persistent else LiveState.thaw(initial)
        self.check_every = check_every
        self.incremental: IncrementalChecker | None = None
        if checker is None and check_every and not full_checks and not self.persistent:
            self.incremental = IncrementalChecker(self.state)
        self.checker: Checker = check if checker is None else checker

    def apply(self, event: Event) -> None:
        if self.persistent:
            self.state = apply_valid(self.state, event)
        else:
            self.state.apply(event)

    def violations(self) -> list[Violation]:
        if self.incremental is not None:
            return self.incremental.check()
        return self.checker(self.state)

    def run(self, reader: LogReader, until: int | None, verify: bool,
            on_event: EventHook | None, on_progress: Callable[[int, int], None] | None,
            progress_every: int) -> Any:
        result, summary = self.result, self.result.summary
        check_every = self.check_every
        index = last_checked = 0
        num_pages = result.header.geometry.num_pages
        pending: set[Any] = set()  # requests still waiting for their first allocation
        last: Event | None = None
        try:
            for offset, item in reader.records():
                kind = type(item)
                if kind is Checkpoint or kind is EndRecord:
                    if verify and not self._fingerprint_ok(item, index, offset):  # type: ignore[arg-type]
                        break
                    summary.checkpoints_verified += kind is Checkpoint
                    continue
                if until is not None and index >= until:
                    result.stopped_early = True
                    break
                measure = measure_before(self.state, item)  # type: ignore[arg-type]
                try:
                    self.apply(item)  # type: ignore[arg-type]
                except InvalidEvent as exc:
                    result.failure = ReplayFailure("invalid_event", exc.precondition, index,
                                                   item, "rules", offset)  # type: ignore[arg-type]
                    break
                count_after(summary, pending, item, measure,  # type: ignore[arg-type]
                            num_pages - len(self.state.free_pages))
                last = item  # type: ignore[assignment]
                index += 1
                if on_event is not None:
                    on_event(index - 1, item, self.state)  # type: ignore[arg-type]
                if check_every and index % check_every == 0:
                    last_checked = index
                    if self._violated(index - 1, last, offset):
                        break
                if on_progress is not None and index % progress_every == 0:
                    on_progress(index, reader.offset)
        except LogFormatError as exc:
            result.failure = ReplayFailure("format", exc.reason, index, None, None, exc.offset)
        else:
            if result.failure is None and check_every and last_checked != index and index:
                self._violated(index - 1, last, None)
        summary.events = index
        return self.state

    def _fingerprint_ok(self, item: Checkpoint | EndRecord, index: int, offset: int) -> bool:
        expected = item.fingerprint
        got = fingerprint(self.state)
        if got == expected:
            return True
        is_end = isinstance(item, EndRecord)
        what = "end record" if is_end else f"checkpoint at {index}"
        self.result.failure = ReplayFailure(
            "fingerprint", f"{what}: log says {expected.hex()}, replay has {got.hex()}",
            index - 1 if index else None, None, "end" if is_end else "checkpoint", offset)
        return False

    def _violated(self, index: int, event: Event | None, offset: int | None) -> bool:
        self.result.summary.invariant_checks += 1
        violations = self.violations()
        if not violations:
            return False
        first = violations[0]
        more = f" (+{len(violations) - 1} more)" if len(violations) > 1 else ""
        self.result.failure = ReplayFailure("invariant", first.message + more, index, event,
                                            first.check, offset)
        return True


def replay_path(path: str, **options: Any) -> ReplayResult:
    """Open, replay and close a log; ``salvage=`` goes to the reader, the rest to :func:`replay`."""
    salvage = bool(options.pop("salvage", False))
    with LogReader(path, salvage=salvage) as reader:
        return replay(reader, **options)
