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
refused an event), ``digest`` (the bytes of a checkpoint interval do not
match the digest that closes it: the log was edited, even if every
fingerprint still matches), ``fingerprint`` (a checkpoint or the end record
disagrees with the replayed state), ``format`` (malformed bytes or a header
beyond the reader's limits), and ``executor`` (a data-plane hook reported a
problem).  The replay owns only its local counters and state; the reader
is consumed.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import attrs

from kvstate.backends.live import LiveState
from kvstate.backends.persistent import apply_valid
from kvstate.canonical import fingerprint
from kvstate.config import non_negative_int, positive_int
from kvstate.errors import InvalidEvent
from kvstate.events import Event
from kvstate.invariants import CHECKS, Violation, check
from kvstate.invariants.incremental import IncrementalChecker
from kvstate.log.format import Checkpoint, EndRecord, LogFormatError, LogHeader
from kvstate.log.limits import tokens_per_slot
from kvstate.log.reader import LogReader
from kvstate.replay.tally import HOOKS, Summary, add_type_counts, set_units
from kvstate.state import State, initial_state

Checker = Callable[[Any], list[Violation]]
_CHECK_ORDER = {name: index for index, name in enumerate(CHECKS)}
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
    return initial_state(header.geometry, host_pages=header.host_pages,
                         swa_pages=header.swa_pages, mamba_slots=header.mamba_slots)


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
    non_negative_int("check_every", check_every)
    if until is not None:
        non_negative_int("until", until)
    positive_int("progress_every", progress_every)
    header = reader.header
    initial = start_state(header)
    summary = Summary()
    set_units(summary, header.geometry.page_size, header.geometry.mode == "block",
              tokens_per_slot(header.meta))
    result = ReplayResult(header, initial, summary, backend=backend)
    started = time.perf_counter()
    if verify and header.initial_fingerprint and header.initial_fingerprint != initial.fingerprint():
        result.failure = ReplayFailure(
            "fingerprint", "the initial state's fingerprint differs from the header's (the state "
            "encoding changed since this log was written)", check="initial_state")
    final: Any = initial
    compared = None
    if result.failure is None:
        loop = _Loop(result, initial, backend, check_every, checker, full_checks)
        final = loop.run(reader, until, verify, on_event, on_progress, progress_every)
        compared = loop.compared
    result.state = final if isinstance(final, State) else final.freeze()
    summary.seconds = time.perf_counter() - started
    # After an end record (or a checkpoint the replay stopped at) the state's fingerprint is
    # already known: encoding the whole state again would cost as much as the comparison.
    if compared is not None and compared[0] == summary.events:
        summary.final_fingerprint = compared[1].hex()
    else:
        summary.final_fingerprint = fingerprint(final).hex()
    summary.digests = reader.digests
    summary.digests_verified = reader.digests_verified
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
        # (events applied, fingerprint) of the last checkpoint or end record compared
        self.compared: tuple[int, bytes] | None = None

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
        pending: dict[Any, int] = {}  # requests still in their prefill (kvstate.replay.tally)
        counts: Counter[type] = Counter()  # accepted events per class, folded into by_type
        last: Event | None = None
        limit = -1 if until is None else until
        # The hot loop takes the log a block of events at a time and binds what it calls per
        # event: the state's apply and the tally's hook table (most events have no hook).
        apply = self._persistent_apply if self.persistent else self.state.apply
        hook_of = HOOKS.get
        stop = False
        try:
            for offset, run in reader.runs():
                if type(run) is not list:
                    if verify and reader.digest_failure is not None:
                        self._digest_broken(reader, index)
                        break
                    if verify and not self._fingerprint_ok(run, index, offset):  # type: ignore[arg-type]
                        break
                    summary.checkpoints_verified += type(run) is Checkpoint
                    continue
                first = index
                for item in run:
                    if index == limit:
                        result.stopped_early = stop = True
                        break
                    hook = hook_of(type(item))
                    if hook is not None:
                        before, after = hook
                        measured = None if before is None else before(self.state, item, pending)
                    try:
                        apply(item)
                    except InvalidEvent as exc:
                        result.failure = ReplayFailure("invalid_event", exc.precondition, index,
                                                       item, "rules", offset)
                        stop = True
                        break
                    if hook is not None:
                        after(summary, pending, item, measured, self.state)
                    last = item
                    index += 1
                    if on_event is not None:
                        on_event(index - 1, item, self.state)
                    if check_every and index % check_every == 0:
                        last_checked = index
                        if self._violated(index - 1, last, offset):
                            stop = True
                            break
                    if on_progress is not None and index % progress_every == 0:
                        on_progress(index, reader.offset)
                # Counted per run in C; a run cut short counts the events it accepted.
                counts.update(map(type, run if index - first == len(run) else run[:index - first]))
                if stop:
                    break
        except LogFormatError as exc:
            result.failure = ReplayFailure("format", exc.reason, index, None, None, exc.offset)
        else:
            if result.failure is None and check_every and last_checked != index and index:
                self._violated(index - 1, last, None)
        add_type_counts(summary, counts)
        summary.events = index
        return self.state

    def _persistent_apply(self, event: Event) -> None:
        self.state = apply_valid(self.state, event)

    def _digest_broken(self, reader: LogReader, index: int) -> None:
        broken = reader.digest_failure
        assert broken is not None
        self.result.failure = ReplayFailure(
            "digest", broken.describe(), index - 1 if index else None, None,
            "checkpoint" if broken.what == "checkpoint" else "end", broken.offset)

    def _fingerprint_ok(self, item: Checkpoint | EndRecord, index: int, offset: int) -> bool:
        expected = item.fingerprint
        got = fingerprint(self.state)
        self.compared = (index, got)
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
        # The incremental checker finds violations in the order it walks what changed; the
        # registry's order is the full checks' order, so both name the same first check.
        order = _CHECK_ORDER
        first = min(violations, key=lambda v: order.get(v.check, len(order)))
        more = f" (+{len(violations) - 1} more)" if len(violations) > 1 else ""
        self.result.failure = ReplayFailure("invariant", first.message + more, index, event,
                                            first.check, offset)
        return True


def replay_path(path: str, **options: Any) -> ReplayResult:
    """Open, replay and close a log; ``salvage=`` goes to the reader, the rest to :func:`replay`."""
    salvage = bool(options.pop("salvage", False))
    with LogReader(path, salvage=salvage) as reader:
        return replay(reader, **options)
