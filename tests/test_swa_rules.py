"""The SWA rules refuse every illegal event, on both backends, changing nothing.

The base state: FULL pages 1..8, SWA pages 1..4, request row 1; a live node
1 ``[5, 6]`` on pages 1, 2 (paired with SWA 1, 2), a tombstone node 2
``[7]`` on page 3 below it, request 1 holding page 4 paired with SWA 3,
and a FULL lock plus an SWA window lock on node 1 (receipt 1).
"""

from __future__ import annotations

import pytest

from kvstate import apply
from kvstate import events as ev
from kvstate.backends.live import LiveState
from kvstate.errors import InvalidEvent
from kvstate.invariants import check
from kvstate.state import Geometry, initial_state

BASE_EVENTS = [
    ev.ReqAlloc((1,)), ev.Allocate((1, 2, 3)), ev.SwaAlloc(((1, 1), (2, 2))),
    ev.Insert(0, (5, 6), (1, 2), 1, 1), ev.Insert(1, (7,), (3,), 2, 2),
    ev.Allocate((4,), ((1, (4,)),)), ev.SwaAlloc(((4, 3),)), ev.Lock(1), ev.SwaLock(1, 1, 1),
]


def base():
    state = initial_state(Geometry(num_pages=8, num_rows=2), swa_pages=4)
    for event in BASE_EVENTS:
        state = apply(state, event)
    assert check(state) == []
    return state


REFUSED = [
    (ev.SwaAlloc(((5, 4),)), "is free"),
    (ev.SwaAlloc(((4, 4),)), "already has SWA page"),
    (ev.SwaAlloc(((1, 4),)), "is in tree node"),
    (ev.SwaAlloc(((4, 1),)), "already has SWA page"),
    (ev.SwaAlloc(((3, 1),)), "is in tree node"),
    (ev.SwaAlloc(((4, 9),)), "already has"),
    (ev.SwaFree((1,)), "tombstone the node"),
    (ev.SwaFree((5,)), "double free"),
    (ev.SwaFree((4, 4)), "duplicate"),
    (ev.SwaEvict((1,)), "window lock"),
    (ev.SwaEvict((2,)), "already an SWA tombstone"),
    (ev.SwaEvict((0,)), "root"),
    (ev.SwaPublish(1, 9), "already live"),
    (ev.SwaPublish(2, 9), "no SWA page to publish"),
    (ev.SwaPublish(2, 0), "before the clock"),
    (ev.SwaTouch((2,), 9), "tombstone"),
    (ev.SwaTouch((1, 1), 9), "duplicate"),
    (ev.SwaTouch((), 9), "names no node"),
    (ev.SwaLock(2, 2, 2), "needs a FULL lock"),
    (ev.SwaLock(1, 2, 2), "is not on the path"),
    (ev.SwaLock(1, 0, 5), "needs a FULL lock"),
    (ev.SwaUnlock(2, 0), "below zero"),
    (ev.SwaUnlock(1, 7), "not on the path"),
    (ev.SwaAdopt(2, (4,), 2, 9), "not held by 2 alone"),
    (ev.SwaAdopt(1, (4, 5), 1, 9), "not an SWA tombstone"),
    (ev.SwaAdopt(2, (5,), 1, 9), "has no SWA page"),
    (ev.SwaRebind(2, (1,), 9), "already in tree node"),
    (ev.SwaRebind(2, (4, 5), 9), "1 pages, 2 given"),
    (ev.Free((4,)), "free it first"),
    (ev.Evict((1,)), "locked"),
    (ev.Unlock(1), "release the SWA lock first"),
    (ev.Insert(2, (8, 9), (4, 5), 3, 9, 1), "not held"),
]


@pytest.mark.parametrize(("event", "reason"), REFUSED, ids=[str(e) for e, _ in REFUSED])
def test_refused_on_both_backends(event, reason):
    state = base()
    live = LiveState.thaw(state)
    with pytest.raises(InvalidEvent, match=reason):
        apply(state, event)
    with pytest.raises(InvalidEvent, match=reason):
        live.apply(event)
    assert live.fingerprint() == state.fingerprint() == base().fingerprint()


def test_accepted_paths_keep_every_invariant():
    state = base()
    live = LiveState.thaw(state)
    for event in [
        ev.SwaUnlock(1, 1), ev.Unlock(1), ev.SwaTouch((1,), 3), ev.Split(1, 1, 3, 4),
        ev.SwaEvict((3,)), ev.SwaRebind(3, (4,), 5), ev.FreeMapped((4,)), ev.SwaEvict((1, 3)),
        ev.ReqFree((1,)), ev.Reset("tree"),
    ]:
        state = apply(state, event)
        live.apply(event)
        assert check(state) == [], event
        assert live.fingerprint() == state.fingerprint()
    assert list(state.swa.free_pages) == [4, 1, 2, 3]
    assert dict(state.swa.peer) == {} and state.swa.next_uuid == 2


def test_windows_and_recoveries_respect_the_full_lock():
    state = apply(base(), ev.Lock(2))
    with pytest.raises(InvalidEvent, match="FULL-locked"):
        apply(state, ev.SwaAdopt(2, (4,), 1, 9))
    state = apply(state, ev.SwaRebind(2, (4,), 9))  # the locked FULL page 3 keeps its id
    assert state.swa.peer[3] == 3 and 4 not in state.swa.peer and state.nodes[2].swa.live
    state = apply(state, ev.SwaLock(2, 0, 0))  # two tokens < any window: up to the root
    assert [state.nodes[n].swa.lock_ref for n in (1, 2)] == [2, 1]
    assert check(state) == []


def test_split_moves_the_receipt_to_the_top_half():
    state = apply(base(), ev.Split(1, 1, 3, 3))
    top, bottom = state.nodes[3].swa, state.nodes[1].swa
    assert (top.uuid, bottom.uuid) == (1, 0)
    assert top.lock_ref == bottom.lock_ref == 1 and top.stamp == bottom.stamp
    assert apply(state, ev.SwaUnlock(1, 1)).nodes[3].swa.lock_ref == 0


def test_insert_is_live_or_a_tombstone_as_a_whole():
    state = apply(base(), ev.Allocate((5,), ((1, (5,)),)))
    with pytest.raises(InvalidEvent, match="live or a tombstone as a whole"):
        apply(state, ev.Insert(2, (8, 9), (4, 5), 3, 9, 1))


def test_a_touch_names_an_ancestor_chain():
    """``SwaTouch`` moves one chain, each node an ancestor of the one before it."""
    state = apply(base(), ev.Insert(0, (8,), (4,), 3, 9, 1))  # node 3 [8]: live (page 4 paired)
    split = apply(state, ev.Split(1, 1, 4, 10))  # node 4 [5] above node 1 [6]
    live = LiveState.thaw(split)
    for event in (ev.SwaTouch((1, 4), 11), ev.SwaTouch((3,), 12)):
        split = apply(split, event)
        live.apply(event)
        assert check(split) == [] and live.fingerprint() == split.fingerprint()
    assert [split.nodes[n].swa.stamp for n in (1, 4, 3)] == [11, 11, 12]
    for event, reason in ((ev.SwaTouch((3, 1), 13), "node 1 is not an ancestor of node 3"),
                          (ev.SwaTouch((4, 1), 13), "node 1 is not an ancestor of node 4")):
        with pytest.raises(InvalidEvent, match=reason):
            apply(split, event)
        with pytest.raises(InvalidEvent, match=reason):
            live.apply(event)


def test_a_tree_reset_frees_the_live_nodes_swa_pages():
    """``Reset("tree")`` drops every node; a live node's SWA pages go back (tail, in
    ascending order of their FULL pages), a request's pairs stay."""
    state = base()
    live = LiveState.thaw(state)
    for event in (ev.SwaUnlock(1, 1), ev.Unlock(1), ev.Reset("tree")):
        state = apply(state, event)
        live.apply(event)
    assert check(state) == [] and live.fingerprint() == state.fingerprint()
    assert list(state.swa.free_pages) == [4, 1, 2]
    assert dict(state.swa.peer) == {4: 3} and state.swa.evictable == 0


def test_swa_allocation_names_each_broken_pair_exactly():
    state = apply(base(), ev.Allocate((5,)))  # FULL page 5: held (DETACHED), not paired
    for event, message in [
        (ev.SwaAlloc(((4, 4), (4, 4))), "duplicate FULL page 4 in one event"),
        (ev.SwaAlloc(((5, 4), (6, 4))), "duplicate SWA page 4 in one event"),
        (ev.SwaAlloc(((5, 9),)), "SWA page 9 is outside 1..4"),
        (ev.SwaAlloc(((5, 3),)), "SWA page 3 is not free"),
        (ev.SwaAlloc(((6, 4),)), "FULL page 6 is free (pair only allocated pages)"),
    ]:
        with pytest.raises(InvalidEvent) as frozen:
            apply(state, event)
        with pytest.raises(InvalidEvent) as live:
            LiveState.thaw(state).apply(event)
        assert frozen.value.precondition == live.value.precondition == message
