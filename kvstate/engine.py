"""``Engine``: the one mutable cell around the rules.

An engine owns the current state and (optionally) the events applied so far.
Front ends (the SGLang objects, the seed-002 manager, the vLLM classes)
share one engine; every change goes through :meth:`apply` (one event) or a
:meth:`batch` (the events of one planner decision).  Backends:

* ``"live"`` (the default): the rules change a ``LiveState`` in place.
  ``engine.view`` is that live state (read it, never write it);
  ``engine.state`` freezes it into a ``State``, cached until the next event,
  in time proportional to the events since the last freeze when that is
  cheaper than a full copy (they are re-applied to the last frozen state).
* ``"persistent"``: every event makes a new frozen ``State``; ``view`` and
  ``state`` are the same object.  For checking.

``verify_every=N`` re-applies each run of N events to the last verified
snapshot through the persistent backend and compares fingerprints: a
production engine checking itself on a sample, at the cost of N persistent
steps plus two fingerprints per N events.

Listeners (a recorder, an executor, the request-table tensor) subscribe with
:meth:`subscribe`; ``kvstate.listeners`` gives the protocol (``before``,
``discard``, ``after``, ``rolled_back``) and what happens when one of them
fails.  A batch is applied whole before any ``after`` runs, so a listener that
fails never leaves the engine between two events of a decision.

When something fails inside a batch, the state is what it was before the
batch: a refused event, a rule that raised anything but ``InvalidEvent``
(it may have written part of its event, so the batch is rolled back even if
that was its first event, and even if the block caught the error), a
listener's ``before``, or the planner's own code.  ``engine.state`` read
inside a batch shows the batch so far, without moving the baseline a
rollback starts from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kvstate.backends.live import LiveState
from kvstate.backends.persistent import apply_valid
from kvstate.errors import EngineBroken, InvalidEvent, VerificationError
from kvstate.events import Event, EventDecodeError, validated
from kvstate.listeners import Listeners
from kvstate.state import Geometry, State, initial_state

R = TypeVar("R")
BACKENDS = ("live", "persistent")


class Engine:
    """Holds the state and the events; mutates only through ``apply`` / ``batch``."""

    def __init__(self, geometry: Geometry | None = None, *, state: State | None = None,
                 backend: str = "live", verify_every: int = 0, keep_events: bool = True,
                 host_pages: int = 0) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if isinstance(verify_every, bool) or not isinstance(verify_every, int) or verify_every < 0:
            raise ValueError(f"verify_every must be an int >= 0, got {verify_every!r}")
        if state is None:
            state = initial_state(geometry if geometry is not None else Geometry(num_pages=1),
                                  host_pages=host_pages)
        self.backend = backend
        self.verify_every = verify_every
        self._keep_events = keep_events
        self._initial = state
        self._events: list[Event] = []
        self._listeners = Listeners()
        self._broken: BaseException | None = None
        self._batch: list[Event] | None = None
        self._rule_failed = False  # a rule raised something other than InvalidEvent
        self._reset_to(state)

    def _reset_to(self, state: State) -> None:
        self._live = LiveState.thaw(state) if self.backend == "live" else None
        self._current = state  # persistent backend: the state; live: unused
        self._frozen: State | None = state  # the last frozen state (live backend)
        self._journal: list[Event] | None = []  # events since ``_frozen`` (None: not kept)
        self._verified = state
        self._unverified: list[Event] = []

    # -- reading ------------------------------------------------------------------
    @property
    def view(self) -> Any:
        """The current state for reading: the ``LiveState`` itself, or the frozen ``State``."""
        return self._live if self._live is not None else self._current

    @property
    def state(self) -> State:
        """The current state, frozen (cached until the next event)."""
        if self._live is None:
            return self._current
        live = self._live
        frozen = self._frozen
        if frozen is not None and frozen.seq == live.seq:
            return frozen
        journal = self._journal
        if frozen is not None and journal is not None and len(journal) <= _replay_budget(live):
            for event in journal:
                frozen = apply_valid(frozen, event)
        else:
            frozen = live.freeze()
        if self._batch is None:
            # Inside a batch the last frozen state stays the baseline: a batch that fails
            # part way is rolled back by re-applying the journal up to its start onto it,
            # and a state frozen now would already hold some of the batch's events.
            self._frozen = frozen
            self._journal = []
        return frozen

    @property
    def initial_state(self) -> State:
        return self._initial

    @property
    def events(self) -> Sequence[Event]:
        """Events applied so far (a read-only tuple copy; empty with ``keep_events=False``)."""
        return tuple(self._events)

    @property
    def geometry(self) -> Geometry:
        return self._initial.geometry

    @property
    def seq(self) -> int:
        return int(self.view.seq)

    def configure(self, **changes: Any) -> None:
        """Change the geometry of a fresh engine (before any event was applied); ``swa_pages``
        gives it an SWA pool of that many pages, ``mamba_slots`` a Mamba pool of that many
        slots (it keeps its pools otherwise)."""
        if self.seq != self._initial.seq or self._initial.seq != 0:
            raise RuntimeError("an engine's geometry is fixed once events were applied")
        swa, mamba = self._initial.swa, self._initial.mamba
        swa_pages = changes.pop("swa_pages", 0 if swa is None else swa.num_pages)
        mamba_slots = changes.pop("mamba_slots", 0 if mamba is None else mamba.num_slots)
        fields = {"num_pages": self.geometry.num_pages, "page_size": self.geometry.page_size,
                  "num_rows": self.geometry.num_rows, "row_width": self.geometry.row_width,
                  "mode": self.geometry.mode, **changes}
        host = self._initial.host
        self._initial = initial_state(Geometry(**fields),
                                      host_pages=0 if host is None else host.num_pages,
                                      swa_pages=swa_pages, mamba_slots=mamba_slots)
        self._reset_to(self._initial)

    # -- listeners ------------------------------------------------------------------
    def subscribe(self, listener: Any) -> None:
        """Add a listener (an object with ``after`` and maybe ``before``, or a callable)."""
        self._listeners.subscribe(listener)

    def unsubscribe(self, listener: Any) -> None:
        self._listeners.unsubscribe(listener)

    # -- changing ---------------------------------------------------------------------
    def apply(self, event: Event) -> None:
        """Validate and apply one event; ``InvalidEvent`` (nothing changed) if it is not legal."""
        try:
            event = validated(event)
        except EventDecodeError as exc:
            raise InvalidEvent(event, self.seq, str(exc)) from None
        self.commit_events((event,))

    def batch(self) -> Batch:
        """Apply the events of one decision; listeners see them when the block ends.

        Use as ``with engine.batch() as b:``.  If the block raises after events
        were applied, the live backend rolls back when it can (a frozen state
        and the events since it are known) and otherwise refuses further use
        (``EngineBroken``).
        """
        return Batch(self)  # checked when it opens (``Batch.__enter__``)

    def _check_can_open(self) -> None:
        if self._broken is not None:
            raise EngineBroken(f"engine unusable after an earlier failure: {self._broken}")
        if self._batch is not None:
            raise RuntimeError("batches do not nest; emit into the open batch")
        if self._listeners.committing:
            # A listener changing the engine from ``after`` would commit its events before
            # the listeners after it heard of the batch that caused them: out of order.
            raise RuntimeError("a listener's after() cannot change the engine it listens to")

    def _open_batch(self) -> tuple[State, int, int | None]:
        self._batch = []
        live, journal = self._live, self._journal
        return (self._current, live.seq if live is not None else self._current.seq,
                None if journal is None else len(journal))

    def _close_batch(self, start: tuple[State, int, int | None], failed: BaseException | None
                     ) -> None:
        events, self._batch = self._batch, None
        rule_failed, self._rule_failed = self._rule_failed, False
        caught = failed is None and rule_failed  # the block caught a rule's failure, went on
        if caught:
            failed = RuntimeError("a rule failed inside this batch, which was rolled back")
        if failed is not None:
            if events or rule_failed:
                try:
                    self._roll_back(*start, failed)
                finally:
                    if events:
                        self._listeners.rolled_back(events, failed)
            if caught:
                raise failed
            return
        if events:
            self._commit(events)

    def emit(self, event: Event) -> None:
        """Apply a well-typed event inside the open batch (planners)."""
        batch = self._batch
        if batch is None:
            raise RuntimeError("emit needs an open batch (engine.batch())")
        live = self._live
        befores = self._listeners.befores
        kind = type(event)
        if befores:
            view = live if live is not None else self._current
            prepared = 0  # the listeners whose ``before`` has seen this event
            try:
                for listener, kinds in befores:
                    if kinds is None or kind in kinds:
                        listener.before(event, view)
                    prepared += 1
            except BaseException as exc:
                self._listeners.discard(befores[:prepared], event, exc)
                raise
        try:
            if live is not None:
                live.apply(event)
            else:
                self._current = apply_valid(self._current, event)
        except BaseException as exc:
            if not isinstance(exc, InvalidEvent):
                # Not a refusal but a failure inside the rule, which may have written part
                # of the event: the batch is rolled back even if this was its first event.
                self._rule_failed = True
            self._listeners.discard(befores, event, exc)  # the event did not happen
            raise
        journal = self._journal
        if journal is not None:
            journal.append(event)
        batch.append(event)

    def commit_events(self, events: Sequence[Event]) -> None:
        """Well-typed events already decided, as one batch: what ``with engine.batch() as b:``
        emitting each does (the same rollback, listeners and errors), without the batch
        object.  Front ends use it for decisions they build from checked arguments; an
        event from outside goes through ``apply``, which validates its fields first."""
        if self._batch is not None or self._broken is not None or self._listeners.committing:
            self._check_can_open()  # raises
        start = self._open_batch()
        failed: BaseException | None = None
        try:
            for event in events:
                self.emit(event)
        except BaseException as exc:
            failed = exc
            raise
        finally:
            self._close_batch(start, failed)

    def commit(self, plan: Any) -> Any:
        """Apply a ``Plan`` computed elsewhere (its events, in one batch); its result."""
        self.commit_events(plan.events)
        return plan.result

    def _commit(self, events: list[Event]) -> None:
        if self._keep_events:
            self._events.extend(events)
        journal = self._journal
        if journal is not None and len(journal) > _JOURNAL_LIMIT:
            self._journal = None  # too long to replay: the next freeze copies instead
            self._frozen = None
        if self.verify_every:
            self._unverified.extend(events)
            if len(self._unverified) >= self.verify_every:
                self._verify()
        self._listeners.after(events, self._live if self._live is not None else self._current)

    def _roll_back(self, start_state: State, start_seq: int, start_journal: int | None,
                   exc: BaseException) -> None:
        if self._live is None:
            self._current = start_state
            return
        frozen, journal = self._frozen, self._journal
        if frozen is not None and journal is not None and start_journal is not None:
            state = frozen
            for event in journal[:start_journal]:
                state = apply_valid(state, event)
            self._live = LiveState.thaw(state)
            self._frozen, self._journal = state, []
            return
        self._broken = exc
        raise EngineBroken(f"a batch failed after {self.seq - start_seq} of its events were "
                           f"applied and cannot be rolled back: {exc}") from exc

    def _verify(self) -> None:
        events, self._unverified = self._unverified, []
        state = self._verified
        for event in events:
            state = apply_valid(state, event)
        live = self._live
        if live is None or state.fingerprint() == live.fingerprint():
            self._verified = state
            return
        self._broken = AssertionError("verification failed")
        replay = LiveState.thaw(self._verified)
        state = self._verified
        base = self.seq - len(events)
        for index, event in enumerate(events):
            state = apply_valid(state, event)
            replay.apply(event)
            if state.fingerprint() != replay.fingerprint():
                raise VerificationError(base + index, event,
                                        "the live and persistent backends diverge here")
        raise VerificationError(self.seq - 1, events[-1],
                                "the live state differs from a fresh replay of the same events")


class Batch:
    """The handle a planner emits into (``state`` to read, ``emit`` to apply); a context
    manager that commits the batch when the block ends (``Engine.batch``).

    ``state`` and ``emit`` are plain attributes, not properties: planners read ``b.state``
    many times per decision.  On the live backend they are the engine's live state and its
    own ``emit`` (the state object does not change inside a batch); on the persistent one
    ``emit`` also refreshes ``state`` to the new value.
    """

    __slots__ = ("engine", "_start", "state", "emit")

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._start: tuple[State, int, int | None] | None = None
        # (the engine's fields, not its properties: a batch opens once per front-end call)
        live = engine._live
        self.state: Any = live if live is not None else engine._current
        self.emit: Callable[[Event], None] = (
            engine.emit if live is not None else self._emit_and_refresh)

    def __enter__(self) -> Batch:
        engine = self.engine
        if engine._batch is not None or engine._broken is not None or \
                engine._listeners.committing:
            engine._check_can_open()  # raises: one batch at a time, never on a broken engine
        self._start = engine._open_batch()
        live = engine._live
        self.state = live if live is not None else engine._current
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: Any) -> None:
        start, self._start = self._start, None
        assert start is not None
        self.engine._close_batch(start, error)

    @property
    def events(self) -> list[Event]:
        return self.engine._batch or []

    def _emit_and_refresh(self, event: Event) -> None:
        self.engine.emit(event)
        self.state = self.engine.view


_JOURNAL_LIMIT = 1 << 16


def _replay_budget(live: LiveState) -> int:
    """How many events re-applied cost about as much as one full freeze of ``live``."""
    return max(64, (len(live.holders) + len(live.nodes) + len(live.requests)) // 8)
