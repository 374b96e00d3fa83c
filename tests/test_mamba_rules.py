"""The Mamba rules: each event's effect, and every illegal event refused on both backends,
changing nothing.

The base state: FULL pages 1..8, Mamba slots 1..6, request rows 1 and 2; a
node 1 ``[5, 6]`` on pages 1, 2 with state slot 3 below a node 2 ``[7]`` on
page 3 with no state; row 1 holding running slot 1 and track slots 2, 4;
slot 5 DETACHED; node 1 locked (FULL and Mamba).
"""

from __future__ import annotations

import pytest

from kvstate import apply
from kvstate import events as ev
from kvstate.backends.live import LiveState
from kvstate.errors import InvalidEvent
from kvstate.invariants import check
from kvstate.state import Geometry, initial_state
from specs.model_mamba import abstract_mamba, sizes, step_mamba
from specs.model_state import ModelReject

BASE_EVENTS = [
    ev.ReqAlloc((1, 2)), ev.Allocate((1, 2, 3)), ev.Insert(0, (5, 6), (1, 2), 1, 1),
    ev.Insert(1, (7,), (3,), 2, 2), ev.MambaAlloc((1, 2, 3, 4, 5)), ev.MambaBind(1, (1, 2, 4)),
    ev.MambaCommit(1, 3, 3), ev.Lock(1), ev.MambaLock(1),
]


def base():
    state = initial_state(Geometry(num_pages=8, num_rows=2), mamba_slots=6)
    for event in BASE_EVENTS:
        state = apply(state, event)
    assert check(state) == []
    return state


REFUSED = [
    (ev.MambaAlloc((6, 6)), "duplicate"),
    (ev.MambaAlloc((1,)), "not free: it is held"),
    (ev.MambaAlloc((3,)), "state of tree node 1"),
    (ev.MambaAlloc((7,)), "outside 1..6"),
    (ev.MambaAlloc(()), "names no slot"),
    (ev.MambaBind(1, (5,)), "already holds"),
    (ev.MambaBind(3, (5,)), "not an open request row"),
    (ev.MambaBind(0, (5,)), "not an open request row"),
    (ev.MambaBind(2, (0, 5)), "running state slot first"),
    (ev.MambaBind(2, (6,)), "not held: it is free"),
    (ev.MambaBind(2, (1,)), "not DETACHED"),
    (ev.MambaBind(2, (5, 5)), "duplicate"),
    (ev.MambaFree((6,)), "not held: it is free"),
    (ev.MambaFree((3,)), "state of tree node 1"),
    (ev.MambaFree((5, 5)), "duplicate"),
    (ev.MambaFree((0,)), "dummy slot"),
    (ev.MambaFree(()), "names no slot"),
    (ev.MambaDonate(2, 1, 5), "holds no Mamba slots"),
    (ev.MambaDonate(1, 0, 5), "track entries 1..2"),
    (ev.MambaDonate(1, 3, 5), "track entries 1..2"),
    (ev.MambaDonate(1, 1, 1), "not DETACHED"),
    (ev.MambaDonate(1, 1, 6), "not held"),
    (ev.MambaCopy(5, 5), "onto itself"),
    (ev.MambaCopy(6, 5), "holds no state"),
    (ev.MambaCopy(5, 3), "destination 3 is not held"),
    (ev.MambaCommit(1, 5, 9), "already holds Mamba state 3"),
    (ev.MambaCommit(2, 6, 9), "not held: it is free"),
    (ev.MambaCommit(2, 5, 0), "before the clock"),
    (ev.MambaCommit(0, 5, 9), "root"),
    (ev.MambaCommit(9, 5, 9), "unknown tree node"),
    (ev.MambaTouch(2, 9), "no Mamba state"),
    (ev.MambaTouch(1, 0), "before the clock"),
    (ev.MambaLock(2), "holds no Mamba state"),
    (ev.MambaLock(1), "needs a FULL lock"),
    (ev.MambaUnlock(2), "below zero"),
    (ev.MambaEvict((1,)), "locked"),
    (ev.MambaEvict((2,)), "holds no Mamba state"),
    (ev.MambaEvict(()), "names no node"),
    (ev.Unlock(1), "Mamba lock"),
    (ev.Evict((1,)), "locked"),
]


@pytest.mark.parametrize(("event", "reason"), REFUSED, ids=[repr(e) for e, _ in REFUSED])
def test_refused_on_both_backends_changing_nothing(event, reason):
    state = base()
    before = state.fingerprint()
    with pytest.raises(InvalidEvent, match=reason):
        apply(state, event)
    live = LiveState.thaw(state)
    with pytest.raises(InvalidEvent, match=reason):
        live.apply(event)
    assert live.fingerprint() == before == state.fingerprint()
    with pytest.raises(ModelReject):
        step_mamba(abstract_mamba(state), event)


def test_no_mamba_pool_refuses_mamba_events():
    state = initial_state(Geometry(num_pages=4))
    with pytest.raises(InvalidEvent, match="no Mamba pool"):
        apply(state, ev.MambaAlloc((1,)))


ACCEPTED = [  # (event, check on the new state)
    (ev.MambaFree((1, 4)), lambda s: s.mamba.rows[1] == (0, 2, 0)
     and list(s.mamba.free_slots)[-2:] == [1, 4]),
    (ev.MambaDonate(1, 2, 5), lambda s: s.mamba.rows[1] == (1, 2, 5) and s.mamba.held[4] == 0),
    (ev.MambaCommit(2, 4, 9), lambda s: s.mamba.nodes[2].slot == 4 and s.mamba.rows[1] == (1, 2, 0)
     and s.mamba.evictable == 1 and s.clock == 9),
    (ev.MambaCopy(3, 5), lambda s: s.mamba == base().mamba),
    (ev.MambaTouch(1, 9), lambda s: s.mamba.nodes[1].stamp == 9),
    (ev.MambaUnlock(1), lambda s: s.mamba.nodes[1].lock_ref == 0 and s.mamba.evictable == 1),
    (ev.ReqFree((1,)), lambda s: 1 not in s.mamba.rows and s.mamba.held[2] == 0),
    (ev.Reset("tree"), lambda s: not s.mamba.nodes and list(s.mamba.free_slots)[-1] == 3),
    (ev.Reset("all"), lambda s: list(s.mamba.free_slots) == [1, 2, 3, 4, 5, 6]
     and not s.mamba.held),
]


@pytest.mark.parametrize(("event", "expect"), ACCEPTED, ids=[repr(e) for e, _ in ACCEPTED])
def test_accepted_events_agree_with_the_model(event, expect):
    state = base()
    after = apply(state, event)
    live = LiveState.thaw(state)
    live.apply(event)
    assert live.fingerprint() == after.fingerprint()
    assert expect(after)
    model = step_mamba(abstract_mamba(state), event)
    assert model == abstract_mamba(after)
    assert sizes(model) == (after.mamba.evictable, after.mamba.protected)
    assert check(after) == []


def test_a_state_leaves_the_tree_only_after_its_node_lost_it():
    state = base()
    for event in (ev.MambaUnlock(1), ev.Unlock(1), ev.Evict((2,))):
        state = apply(state, event)
    with pytest.raises(InvalidEvent, match="MambaEvict"):
        apply(state, ev.Evict((1,)))
    state = apply(apply(state, ev.MambaEvict((1,))), ev.Evict((1,)))
    assert list(state.mamba.free_slots)[-1] == 3 and not state.mamba.nodes
    assert check(state) == []


def test_split_keeps_the_state_below():
    state = apply(base(), ev.Split(1, 1, 3, 9))
    assert state.mamba.nodes[1].slot == 3 and 3 not in state.mamba.nodes
    assert state.nodes[3].lock_ref == 1 and check(state) == []


def test_encoding_without_a_pool_is_unchanged():
    from kvstate.canonical import components

    plain = initial_state(Geometry(num_pages=4))
    assert plain.mamba is None
    assert not any(name.startswith("mamba.") for name, _ in components(plain))
    pooled = initial_state(Geometry(num_pages=4), mamba_slots=2)
    assert [name for name, _ in components(pooled)][-5:] == [
        "mamba.num_slots", "mamba.free_slots", "mamba.held", "mamba.rows", "mamba.nodes"]
    assert plain.fingerprint() != pooled.fingerprint()
    both = initial_state(Geometry(num_pages=4), swa_pages=2, mamba_slots=2)
    swa_only = initial_state(Geometry(num_pages=4), swa_pages=2)
    assert both.fingerprint() != swa_only.fingerprint()


def test_pool_sizes_are_checked():
    with pytest.raises(ValueError, match="positive int"):
        initial_state(Geometry(num_pages=4), mamba_slots=-1)
    with pytest.raises(ValueError, match="radix mode"):
        initial_state(Geometry(num_pages=4), host_pages=2, mamba_slots=2)
