"""The two backends run the same rules: every event gives the same state or the same error.

Random event streams (valid and invalid, from the explorer's candidate
generator) go through the persistent backend and the live backend side by
side; after every event the fingerprints, the derived indexes and the error
messages must agree, and a rejected event must leave the live state exactly
as it was.  A freeze after every event keeps ``LiveState.freeze`` honest.
"""

from __future__ import annotations

import gc
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstate import apply
from kvstate import events as ev
from kvstate.backends.live import LiveState
from kvstate.backends.persistent import apply_valid
from kvstate.checking.enabled import candidate_events
from kvstate.checking.levels import geometry_of
from kvstate.checking.scopes import SCOPES
from kvstate.errors import InvalidEvent
from kvstate.freequeue import FreeQueue, LiveQueue
from kvstate.invariants import check
from kvstate.state import Geometry, initial_state


def _derived(state):
    return (dict(state.leaves.items()), dict(state.tree_refs.items()),
            {n: node.below for n, node in state.nodes.items()})


def _walk(scope_name: str, seed: int, steps: int) -> None:
    scope = SCOPES[scope_name]
    rng = random.Random(seed)
    frozen = initial_state(geometry_of(scope), host_pages=scope.host_pages)
    live = LiveState.thaw(frozen)
    for _ in range(steps):
        candidates = list(candidate_events(frozen, scope))
        event = rng.choice(candidates)
        before = live.fingerprint()
        try:
            after = apply_valid(frozen, event)
            error = None
        except InvalidEvent as exc:
            after, error = None, exc.precondition
        try:
            live.apply(event)
            live_error = None
        except InvalidEvent as exc:
            live_error = exc.precondition
        assert live_error == error, event
        if after is None:
            assert live.fingerprint() == before, f"{event!r} was refused but changed the state"
            continue
        frozen = after
        assert live.fingerprint() == frozen.fingerprint(), event
        thawed = live.freeze()
        assert thawed.fingerprint() == frozen.fingerprint()
        assert _derived(thawed) == _derived(frozen), event
        assert check(live) == check(frozen) == []


@pytest.mark.parametrize("scope", ["tiny", "paged", "tree", "core6", "rows-sglang",
                                   "rows-sglang-paged", "block", "host"])
@pytest.mark.parametrize("seed", range(4))
def test_backends_agree_on_random_walks(scope, seed):
    _walk(scope, seed, 150)


def test_public_apply_validates_fields():
    state = initial_state(Geometry(num_pages=4))
    for bad in (ev.Allocate(("x",)), ev.Allocate((1.5,)), ev.Allocate((True,)),
                ev.Free((-1,)), ev.Touch((0,), 2**63)):
        with pytest.raises(InvalidEvent):
            apply(state, bad)
    assert apply(state, ev.Allocate([1, 2])).holders[1] == (0,)  # lists are normalised


@given(st.lists(st.tuples(st.sampled_from(["head", "tail", "take", "take_head"]),
                          st.lists(st.integers(1, 40), max_size=4)), max_size=40),
       st.booleans())
def test_free_queues_agree(operations, desc):
    """``FreeQueue`` (persistent) and ``LiveQueue`` (in place) keep the same order."""
    frozen = FreeQueue.from_range(1, 21, desc=desc)
    live = LiveQueue(1, 21, desc=desc)
    for kind, items in operations:
        items = list(dict.fromkeys(items))
        if kind == "take":
            items = [i for i in items if i in frozen]
            frozen, live = frozen.take(items), live.take(items)
        elif kind == "take_head":  # the head, as many items as were drawn
            items = frozen.head(len(items))
            frozen, live = frozen.take_head(items), live.take_head(items)
        else:
            items = [i for i in items if i not in frozen]
            if kind == "head":
                frozen, live = frozen.push_head(items), live.push_head(items)
            else:
                frozen, live = frozen.push_tail(items), live.push_tail(items)
        assert list(frozen) == list(live) == list(live.freeze()) == list(frozen.thaw())
        assert len(frozen) == len(live) == len(list(live))
        assert frozen.head(3) == live.head(3)
        assert all(i in frozen and i in live for i in live)


def test_initial_state_costs_no_memory_per_page():
    state = initial_state(Geometry(num_pages=10**12, num_rows=10**9))
    assert len(state.free_pages) == 10**12 and len(state.free_rows) == 10**9
    assert state.free_pages.head(2) == [1, 2] and state.free_rows.head(2) == [10**9, 10**9 - 1]
    live = LiveState.thaw(state)
    live.apply(ev.Allocate((1, 2)))
    assert len(live.free_pages) == 10**12 - 2


def test_big_tuple_valued_maps_stay_in_the_old_generation():
    # A plain dict of atomic keys and values is untracked by a collection and re-enters
    # the youngest generation at the next fresh tuple, so every young collection would
    # walk the whole page map again (O(pool) per collection).  The live maps must stay
    # tracked through a collection.
    geometry = Geometry(num_pages=64, num_rows=4)
    live = LiveState.thaw(initial_state(geometry, host_pages=4))
    mamba = LiveState.thaw(initial_state(geometry, mamba_slots=4))
    live.apply(ev.ReqAlloc((1,)))
    live.apply(ev.Allocate((1, 2, 3), ((1, (1, 2, 3)),)))
    plain = dict(live.holders)
    gc.collect()
    assert not gc.is_tracked(plain)  # what a plain dict of the same items does
    maps = [live.holders, live.host.backup, live.host.evicted, live.host.evicted_children,
            mamba.mamba.rows, mamba.mamba.nodes]
    assert all(gc.is_tracked(m) for m in maps)
