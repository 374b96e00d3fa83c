"""What a log replays from, and with which reducer: a plain core state or a tiered one.

A log's header says how its run started.  ``initial: "empty"`` is
``initial_state(geometry)`` folded with :func:`kvstate.reducer.apply`;
``initial: "tiered"`` adds a host tier of ``host_pages`` pages
(:class:`kvstate.state_host.TieredState`) folded with
:func:`kvstate.reducer.host.apply_tiered`, so offload, load and host-free
events replay too.  Every function here is pure and returns new objects.

Consumers that only read the device side (summaries, ``--show``, diffs) take
:func:`core_of` the replayed state.
"""

from __future__ import annotations

from collections.abc import Callable

from kvstate.events import Event
from kvstate.invariants import Violation, check
from kvstate.invariants_host import check_host
from kvstate.log.format import LogHeader
from kvstate.reducer import apply
from kvstate.reducer.host import apply_tiered
from kvstate.state import Geometry, State, initial_state
from kvstate.state_host import TieredState, tiered

ReplayState = State | TieredState
Applier = Callable[[ReplayState, Event], ReplayState]


def start_state(header: LogHeader) -> ReplayState:
    """The state before the log's first event."""
    return initial_for(header.geometry, header.host_pages)


def initial_for(geometry: Geometry, host_pages: int) -> ReplayState:
    core = initial_state(geometry)
    return tiered(core, host_pages) if host_pages else core


def applier(header: LogHeader) -> Applier:
    """The reducer the log's events go through (raises ``InvalidEvent`` like ``apply``)."""
    return apply_tiered if header.host_pages else apply  # type: ignore[return-value]


def core_of(state: ReplayState) -> State:
    """The device-side core state (the state itself for a plain log)."""
    return state.core if isinstance(state, TieredState) else state


def with_host_checks(checker: Callable[[State], list[Violation]]
                     ) -> Callable[[ReplayState], list[Violation]]:
    """``checker`` on the core, plus the host-tier invariants when the state has a tier."""

    def run(state: ReplayState) -> list[Violation]:
        if not isinstance(state, TieredState):
            return checker(state)
        return checker(state.core) + check_host(state)

    return run


DEFAULT_CHECKER = with_host_checks(check)
