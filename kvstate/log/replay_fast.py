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
from kvstate.events import Event
from kvstate.log.format import Checkpoint, EndRecord, LogFormatError
from kvstate.log.reader import LogReader
from kvstate.log.tally import count_after, measure_before
from kvstate.state import State
from kvstate.transient import TransientApplier

if TYPE_CHECKING:
    from kvstate.invariants import Violation
    from kvstate.log.replay import ReplayResult

FAST_MIN_INTERVAL = 64  # thinner checks than this would freeze too often to pay off


def run_transient(reader: LogReader, result: ReplayResult, state: State, check_every: int,
                  until: int | None, checker: Callable[[Any], list[Violation]], verify: bool,
                  on_progress: Callable[[int, int], None] | None, progress_every: int) -> State:
    """Replay the rest of ``reader`` from ``state``; fills ``result``, returns the final state."""
    from kvstate.log.replay import ReplayFailure, violated

    summary = result.summary
    applier = TransientApplier(state)
    num_pages = state.geometry.num_pages
    pending: set[Any] = set()  # requests still waiting for their first allocation
    index = last_checked = 0
    last: Event | None = None
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
            measure = measure_before(applier.transient, item)  # type: ignore[arg-type]
            try:
                applier.apply(item)  # type: ignore[arg-type]
            except InvalidEvent as exc:
                result.failure = ReplayFailure("invalid_event", exc.precondition, index,
                                               item, "reducer", offset)  # type: ignore[arg-type]
                break
            count_after(summary, pending, item, measure,  # type: ignore[arg-type]
                        num_pages - len(applier.transient.free_pages.order))
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
    return applier.state()
