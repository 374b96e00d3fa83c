"""The reducer rejects every invalid event with InvalidEvent and leaves the state as it was."""

import pytest

from kvstate import Geometry, InvalidEvent, apply, apply_all, check, initial_state
from kvstate.events import (
    Allocate,
    Append,
    Evict,
    Free,
    Insert,
    Lock,
    ReqAlloc,
    Split,
    Touch,
    Unlock,
)


def base(page_size=1, num_pages=16):
    """Row 4 holds 4 tokens; node 1 = [1,2,3,4] (tree), pages 5..6 detached."""
    state = initial_state(Geometry(num_pages=num_pages, page_size=page_size, num_rows=4, row_width=64))
    size = page_size
    key_pages = 4 // size if size <= 4 else 1
    tree_slots = tuple(p * size + k for p in range(1, key_pages + 1) for k in range(size))
    key = tuple(range(100, 100 + len(tree_slots)))
    return apply_all(state, [
        Allocate(tuple(range(1, key_pages + 1))),
        Insert(0, key, tree_slots, 1, 1, 0),
        ReqAlloc((4,)),
        Allocate((key_pages + 1,), ((4, tuple((key_pages + 1) * size + k for k in range(size))),)),
        Allocate((key_pages + 2, key_pages + 3)),
    ])


def rejects(state, event, fragment):
    before = state.fingerprint()
    with pytest.raises(InvalidEvent, match=fragment) as info:
        apply(state, event)
    assert info.value.seq == state.seq
    assert info.value.event == event
    assert state.fingerprint() == before
    assert check(state) == []


def test_base_state_is_valid():
    assert check(base()) == []
    assert check(base(page_size=4)) == []


def test_double_free():
    state = apply(base(), Free((6,)))
    rejects(state, Free((6,)), "already free")


def test_duplicate_inside_one_free():
    rejects(base(), Free((6, 7, 6)), "duplicate page 6")


def test_freeing_a_slot_the_tree_holds():
    rejects(base(), Free((1,)), "held by tree node 1")


def test_freeing_a_page_a_request_still_holds():
    rejects(base(), Free((5,)), "still held by request")


def test_allocating_a_taken_page():
    rejects(base(), Allocate((6,)), "not free")


def test_allocating_page_zero():
    rejects(base(), Allocate((0,)), "page 0 is the reserved padding page")


def test_allocating_a_taken_row_and_row_zero():
    rejects(base(), ReqAlloc((4,)), "row 4 is already allocated")
    rejects(base(), ReqAlloc((0,)), "row 0 is the reserved padding row")
    rejects(base(), ReqAlloc((9,)), "outside 1..4")


def test_lock_or_unlock_of_an_unknown_node():
    rejects(base(), Lock(42), "unknown tree node 42")
    rejects(base(), Unlock(42), "unknown tree node 42")


def test_unlock_below_zero():
    rejects(base(), Unlock(1), "below zero")


def test_evicting_a_locked_node():
    rejects(apply(base(), Lock(1)), Evict((1,)), "locked")


def test_evicting_a_non_leaf():
    state = apply_all(base(), [Split(1, 2, 2, 2)])
    rejects(state, Evict((2,)), "not a leaf")
    rejects(state, Evict((0,)), "root")


@pytest.mark.parametrize("at,fragment", [
    (0, "must be inside the key"),
    (4, "at or beyond the key length"),
    (5, "at or beyond the key length"),
])
def test_split_outside_the_key(at, fragment):
    rejects(base(), Split(1, at, 2, 2), fragment)


def test_split_off_a_page_boundary():
    state = base(page_size=2)
    rejects(state, Split(1, 1, 2, 2), "off a page boundary")


def test_insert_value_length_differs_from_key_length():
    rejects(base(), Insert(0, (7, 8), (6,), 2, 2, 0), "value length 1 differs from key length 2")


def test_append_beyond_the_allocated_slots():
    rejects(base(), Append(((4, 2),)), "beyond the 1 allocated slots")


def test_time_cannot_go_back_and_node_ids_are_fresh():
    rejects(base(), Touch((1,), 0), "before the clock")
    rejects(base(), Split(1, 2, 7, 2), "new node id must be 2")


def test_error_names_event_sequence_and_precondition():
    state = base()
    with pytest.raises(InvalidEvent) as info:
        apply(state, Free((1,)))
    message = str(info.value)
    assert f"event #{state.seq}" in message and "Free" in message and "tree node" in message
    assert isinstance(info.value, ValueError)
