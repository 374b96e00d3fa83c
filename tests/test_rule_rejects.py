"""Both backends reject every invalid event with the same InvalidEvent and change nothing.

Each case runs the shared rules through the persistent backend (``apply``)
and through a ``LiveState`` thawed from the same state: the same message,
the same event sequence number, and an unchanged fingerprint on both.
"""

import re

import pytest

from kvstate import Geometry, InvalidEvent, apply, apply_all, check, initial_state
from kvstate.backends.live import LiveState
from kvstate.events import (
    Allocate,
    Append,
    Assign,
    BlockAlloc,
    BlockCache,
    BlockClear,
    BlockHold,
    BlockRelease,
    BlockUncache,
    Copy,
    Evict,
    Free,
    FreeMapped,
    HostFree,
    Insert,
    Load,
    Lock,
    Offload,
    ReqAlloc,
    ReqFree,
    Reset,
    Scatter,
    Share,
    Split,
    Touch,
    Truncate,
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
    live = LiveState.thaw(state)
    with pytest.raises(InvalidEvent) as live_info:
        live.apply(event)
    assert live_info.value.precondition == info.value.precondition
    assert live_info.value.seq == state.seq
    assert live.fingerprint() == before and live.seq == state.seq
    assert check(live) == []


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


def test_split_of_the_root_or_a_missing_node_and_touch_of_a_missing_node():
    rejects(base(), Split(0, 1, 2, 2), "cannot split the root")
    rejects(base(), Split(42, 1, 2, 2), "unknown tree node 42")
    rejects(base(), Touch((1, 42), 5), "unknown tree node 42")


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


def test_scatter_and_free_mapped_preconditions():
    state = apply_all(base(), [ReqAlloc((1,)), Allocate((8,))])
    rejects(state, Scatter(((1, 0, 8), (1, 1, 9))), "duplicate request 1")
    rejects(state, Scatter(((1, 0, 8), (2, 0, 9))), "unknown request 2")
    rejects(state, FreeMapped((8,)), "not by one request alone")  # DETACHED, not a row's
    rejects(state, FreeMapped((1,)), "held by tree node 1")


def test_block_rules_refuse_a_radix_state_and_host_rules_a_state_without_a_tier():
    rejects(base(), BlockAlloc(0, (8,)), "needs a block-mode geometry")
    rejects(base(), Offload(1, (0,)), "needs a host tier")


def test_block_preconditions():
    state = initial_state(Geometry(num_pages=4, num_rows=0, row_width=8, mode="block"))
    state = apply_all(state, [ReqAlloc(("a",)), BlockAlloc("a", (1,))])
    rejects(state, BlockAlloc("a", (3,)), "not the head of the free queue")
    rejects(state, BlockRelease("a", (1, 1)), "duplicate page 1")
    rejects(state, BlockRelease(0, (1,)), "not held by 0")
    rejects(state, BlockHold("a", (1,)), "already holds page 1")
    rejects(state, BlockCache(0, ((1, (5,), None, 2),), 0), "free; cache only held pages")
    rejects(state, Reset("tree"), "clears its prefix tree with BlockClear")


def test_slot_geometry_is_explained():
    state = base(page_size=2)  # row 4 maps page 3 (slots 6, 7); page 6 is free
    rejects(state, Allocate((6,), ((4, (13, 12)),)), r"slot 13 at position 2 breaks slot % P")
    rejects(state, Allocate((6,), ((4, (14, 13)),)), r"slot 13 at position 3 .*expected slot 15")
    rejects(state, Allocate((7,), ((4, (12,)),)), "page 6 must be newly allocated")


def accepts(state, event):
    """Both backends accept ``event`` and end equal; the result is checked clean."""
    after = apply(state, event)
    live = LiveState.thaw(state)
    live.apply(event)
    assert live.fingerprint() == after.fingerprint()
    assert check(after) == []
    return after


def test_one_request_in_several_items_is_checked_item_by_item():
    state = base()  # row 4 maps page 5 (one token); pages 8.. are free
    after = accepts(state, Allocate((8, 9), ((4, (8,)), (4, (9,)))))
    assert after.requests[4].pages == (5, 8, 9) and after.requests[4].allocated == 3
    after = accepts(state, Allocate((8,), ((4, ()), (4, (8,)))))  # an empty item is skipped
    assert after.requests[4].pages == (5, 8)
    rejects(state, Allocate((8, 9), ((4, (8,)), (4, (8,)))), "page 8 must be newly allocated")
    rejects(state, Allocate((8, 9, 10), ((4, (8,)), (4, (9,)))),
            r"pages \[10\] were allocated but mapped by no item")
    rejects(state, Allocate((8, 9), ((4, (8,)),)), r"pages \[9\] were allocated but mapped by no item")
    rejects(state, Allocate((8, 9), ((4, (8,)), (4, (9,)), (3, (10,)))), "unknown request 3")
    rejects(state, Allocate((8,), ((3, (8,)),)), "unknown request 3")


def test_several_items_of_one_request_continue_its_partial_page():
    """Paged: a later item continues the page an earlier item opened, or the row's own
    partial page; each item is checked against the row as the earlier items left it."""
    state = base(page_size=2)  # row 4 maps page 3 (slots 6, 7); pages 8.. are free
    after = accepts(state, Allocate((8,), ((4, (16,)), (4, (17,)))))
    assert after.requests[4].pages == (3, 8) and after.requests[4].allocated == 4
    rejects(state, Allocate((8,), ((4, (16,)), (4, (16,)))), r"slot 16 at position 3 breaks")
    rejects(state, Allocate((8,), ((4, (16,)), (4, (19,)))), r"slot 19 at position 3 .*expected slot 17")
    partial = apply(state, Truncate(4, 1))  # row 4 holds page 3 with one token
    after = accepts(partial, Allocate((8,), ((4, (7,)), (4, (16, 17)))))
    assert after.requests[4].pages == (3, 8) and after.requests[4].allocated == 4
    rejects(partial, Allocate((8,), ((4, (6,)), (4, (16,)))), r"slot 6 at position 1 breaks")
    rejects(partial, Allocate((8,), ((4, (9,)), (4, (16,)))), r"slot 9 at position 1 .*expected slot 7")
    shared = apply_all(partial, [ReqAlloc((1,)), Share(1, 0, (6, 7))])  # page 3 is shared now
    rejects(shared, Allocate((8,), ((4, (7,)), (4, (16,)))), "must hold its partial page 3 alone")


def host_state():
    """P=1, 6 pages, 4 host pages: node 1 [5, 6] backed up, node 2 [7] under it backed up
    and evicted to host only (page 3 free again), node 3 [9, 8] (not backed up) beside
    node 1 on pages 4, 5; page 6 free."""
    state = initial_state(Geometry(num_pages=6, num_rows=2, row_width=6), host_pages=4)
    return apply_all(state, [
        Allocate((1, 2, 3, 4, 5)), Insert(0, (5, 6), (1, 2), 1, 1, 0),
        Insert(1, (7,), (3,), 2, 2, 0), Insert(0, (9, 8), (4, 5), 3, 3, 0),
        Offload(1, (0, 1)), Offload(2, (2,)), Evict((2,))])


def test_host_preconditions_name_what_they_check():
    plain = base()
    rejects(plain, Offload(1, (0,)), r"^.*rejected: Offload needs a host tier \(a state built with "
                                     r"initial_state\(geometry, host_pages=N\)\)$")
    rejects(plain, Load(1, (8,), 9), "Load needs a host tier")
    rejects(plain, HostFree((1,)), "HostFree needs a host tier")
    state = host_state()
    rejects(state, Offload(3, (3, 3)), "duplicate host page 3 in one event")
    rejects(state, Offload(3, (0, 3)), "host page 0 is owned by node 1")
    rejects(state, Load(2, (6, 6), 9), "node 2 needs 1 pages, got 2")
    rejects(state, Load(2, (4,), 9), "page 4 is not free")
    rejects(state, HostFree((1, 1)), "duplicate node 1 in one event")
    rejects(state, HostFree((1,)), "node 1 still has host-only children")
    rejects(state, Copy((1, 2), (5,)), "copy needs one destination page per source page")


def test_host_events_keep_sizes_leaves_and_order():
    state = host_state()
    assert state.evictable_size == 4  # nodes 1 and 3 (2 tokens each) on the device
    loaded = accepts(state, Load(2, (6,), 9))
    assert loaded.evictable_size == 5 and set(loaded.leaves.keys()) == {2, 3}
    assert loaded.nodes[2].pages == (6,) and loaded.clock == 9
    dropped = accepts(state, HostFree((2, 1), True))  # the child first, then its parent
    assert len(dropped.host.free_pages) == 4 and dropped.host.free_pages.head(3) == [0, 1, 2]
    evicted = accepts(state, Evict((3,)))  # no copy, no host-only child: plainly evicted
    assert 3 not in evicted.nodes and 3 not in evicted.host.evicted
    rejects(loaded, Load(2, (3,), 10), "node 2 is not a host-only node")


def test_row_writes_free_mapped_share_and_copy_name_what_they_check():
    state = apply_all(base(), [ReqAlloc((1, 2)), Allocate((8, 9), ((1, (8,)), (2, (9,))))])
    rejects(state, Append(((1, 1), (1, 1))), "duplicate request 1 in one event")
    committed = accepts(state, Append(((4, 1),)))
    rejects(committed, Append(((4, 0),)), "append cannot lower committed tokens of 4 from 1 to 0")
    assert accepts(committed, Append(((4, 1),))).requests[4].committed == 1  # the same again
    rejects(state, Share(2, 1, (8, 8)), "duplicate page 8 in one event")
    rejects(state, Share(2, 1, (10,)), "page 10 is free; share only pages someone holds")
    rejects(state, Share(2, 2, (8,)), "share must start at the request's page-aligned end 1")
    rejects(state, Share(2, 1, (9,)), "page 9 is already in request 2's table")
    rejects(state, FreeMapped((8, 8)), "duplicate page 8 in one event")
    shared = accepts(state, Share(2, 1, (8,)))
    rejects(shared, FreeMapped((8,)), r"page 8 is held by \[1, 2\], not by one request alone")
    freed = accepts(state, FreeMapped((8,), True))
    assert freed.requests[1].dangling == (0,) and freed.free_pages.head(1) == [8]
    rejects(state, Copy((0,), (6,)), "page 0 is the reserved padding page")
    rejects(state, Copy((99,), (6,)), r"page 99 is outside 1..16")
    rejects(state, Copy((10,), (6,)), "copy source page 10 is free")
    rejects(state, Copy((8,), (9,)), r"copy destination page 9 must be freshly allocated")
    rejects(state, Copy((6,), (6,)), "copy source and destination overlap")
    rejects(state, Copy((8,), (6, 7)), "copy needs one destination page per source page")
    rejects(state, Copy((8, 9), (6, 6)), "duplicate destination page 6 in one event")
    accepts(state, Copy((8,), (6,)))


def test_an_item_that_starts_mid_page_continues_the_partial_page_first():
    partial = apply(base(page_size=2), Truncate(4, 1))  # row 4 holds page 3 with one token
    after = accepts(partial, Allocate((8,), ((4, (7, 16, 17)),)))
    assert after.requests[4].pages == (3, 8) and after.requests[4].allocated == 4
    rejects(partial, Allocate((8,), ((4, (6, 16)),)), r"slot 6 at position 1 breaks slot % P")
    rejects(partial, Allocate((8,), ((4, (9, 16)),)), r"slot 9 at position 1 .*expected slot 7")
    rejects(partial, Allocate((8,), ((4, (7, 18)),)), "page 9 must be newly allocated")
    rejects(partial, Allocate((8,), ((4, (7, 17)),)), r"slot 17 at position 2 breaks slot % P")
    rejects(partial, Allocate((8,), ((4, (7, 16, 19)),)), r"slot 19 at position 3 .*expected slot 17")
    rejects(partial, Allocate((9,), ((1, (2,)),)), "unknown request 1")


def test_truncate_bounds_and_tree_pages_mapped_once():
    state = apply_all(base(), [ReqAlloc((1,)), Assign(1, 0, (1, 2))])  # row 1 maps tree pages
    same = accepts(state, Truncate(1, 2))  # to its own length: nothing changes
    assert same.requests[1].pages == (1, 2)
    rejects(state, Truncate(1, 3), "truncate to 3 outside 0..2")
    rejects(state, Assign(1, 2, (1,)), "page 1 would appear twice in request 1's table")
    rejects(state, Assign(1, 1, (6, 1)), "page 1 would appear twice in request 1's table")
    rejects(state, Assign(1, 3, (6,)), "write at 3 leaves a gap after 2 mapped tokens")
    rejects(state, Assign(1, 0, (6, 6)), "duplicate page 6 in one event")
    rejects(base(), Evict((0,)), "cannot evict the root")
    rejects(base(), Evict((1, 1)), "duplicate node 1 in one event")


def test_radix_events_refuse_a_block_mode_state():
    """The tree holds nothing in block mode: a radix event there would hand out cached
    pages without uncaching them (finding F9), so every one names the mode it needs."""
    from kvstate.events import EVENT_TYPES
    from kvstate.rules import RULE_MODES

    state = initial_state(Geometry(num_pages=4, num_rows=2, row_width=8, mode="block"))
    for event in (Allocate((1,)), Free((1,)), Evict((1,)), Insert(0, (1,), (1,), 1, 1, 0),
                  Lock(1), Touch((1,), 1), Copy((1,), (2,))):
        rejects(state, event, f"{type(event).__name__} needs a radix-mode geometry "
                              r"\(mode='block'\)")
    shared = {name for name, cls in EVENT_TYPES.items() if RULE_MODES[cls] == {"radix", "block"}}
    assert shared == {"ra", "rf", "rs"}  # ReqAlloc, ReqFree, Reset: the only events of both


def test_block_events_need_block_mode_and_keep_page_zero_for_tables():
    for event in (BlockHold(0, (1,)), BlockRelease(0, (1,)), BlockCache(0, ()),
                  BlockUncache((1,), (1,)), BlockClear()):
        rejects(base(), event, f"{type(event).__name__} needs a block-mode geometry")
    state = initial_state(Geometry(num_pages=4, num_rows=0, row_width=8, mode="block"))
    state = apply_all(state, [ReqAlloc(("a",)), BlockAlloc("a", (1,))])
    rejects(state, BlockHold(0, (0,)), "the null page 0 can only pad a request table")
    rejects(state, BlockHold(0, (5,)), r"page 5 is outside 1..4")
    rejects(state, BlockHold("a", (2, 2)), "duplicate page 2 in one event")
    rejects(state, BlockRelease("a", (2, 2)), "duplicate page 2 in one event")
    held = accepts(state, BlockHold(0, (4,)))
    assert held.holders[4] == (0,)


def test_share_checks_page_geometry_and_ignores_dangling_entries():
    """A shared span must stay inside whole pages (P = 2); an entry freed under a live row
    (dangling) no longer maps its page, so the page may be shared into the row again."""
    state = apply(base(page_size=2), ReqAlloc((1,)))  # row 4 maps page 3 (slots 6, 7)
    rejects(state, Share(1, 0, (6, 9)), "slot 9 is not in the page being shared")
    rejects(state, Share(1, 0, (7,)), r"slot 7 at position 0 breaks slot % P == pos % P")
    assert accepts(state, Share(1, 0, (6, 7))).requests[1].pages == (3,)
    rejects(apply(state, Allocate((6,))), Share(1, 0, (12, 13)),
            "page 6 is DETACHED; write it with Assign instead")
    rejects(state, Share(4, 2, (6,)), "page 3 is already in request 4's table")
    plain = apply_all(base(), [ReqAlloc((1, 2)), Allocate((8, 9), ((1, (8,)), (2, (9,))))])
    freed = accepts(plain, FreeMapped((8,), True))  # row 1's entry 0 dangles; page 8 is free
    reused = accepts(freed, Allocate((8,), ((2, (8,)),)))  # row 2 takes page 8
    shared = accepts(reused, Share(1, 1, (8,)))
    assert shared.requests[1].pages == (8, 8) and shared.holders[8] == (2, 1)


def test_block_cache_names_each_broken_entry():
    """``BlockCache`` checks every entry of a chain before it writes: sizes, the chain's
    existing nodes and fresh ids, ``stored_from``, page range, and a page cached twice
    (already in the tree, or twice in this event)."""
    state = initial_state(Geometry(num_pages=4, num_rows=0, row_width=8, page_size=2,
                                   mode="block"))
    state = apply_all(state, [ReqAlloc(("a",)), BlockAlloc("a", (1, 2))])
    rejects(state, BlockCache(0, ((1, (5,), None, 1),), 0), "entry 0: key of 1 tokens, block size is 2")
    rejects(state, BlockCache(0, ((2, (5, 6), None, 1),), 0), "entry 0: new node id must be 1, got 2")
    rejects(state, BlockCache(0, ((1, (5, 6), None, 1),), 1),
            "entry 0 is before stored_from and caches page 1")
    rejects(state, BlockCache(0, ((1, (5, 6), None, 9),), 0), r"page 9 is outside 1..4")
    rejects(state, BlockCache(0, ((1, (5, 6), None, 1), (2, (7, 8), None, 1)), 0),
            r"page 1 is already cached \(tree node 1\)")
    cached = accepts(state, BlockCache(0, ((1, (5, 6), None, 1),), 0))
    copies = accepts(cached, BlockCache(0, ((1, (5, 6), None, 2),), 0))  # a second copy
    assert copies.nodes[1].pages == (1, 2)
    rejects(cached, BlockCache(0, ((3, (5, 6), None, 2),), 0),
            r"entry 0: node 3 is not the child of 0 for this block \(node 1 is\)")
    rejects(cached, BlockCache(0, ((1, (5, 6), None, 1),), 0), r"page 1 is already cached \(tree node 1\)")


def test_rows_closed_together_go_back_so_the_last_is_reused_first():
    """``ReqFree`` of several requests pushes their rows on the free stack in order, so the
    last one named is handed out first (SGLang's ``free`` of a list of rows)."""
    state = apply(base(), ReqAlloc((1, 2)))
    closed = accepts(state, ReqFree((1, 2)))
    assert closed.free_rows.head(2) == [2, 1]
    assert accepts(state, ReqFree((2, 1))).free_rows.head(2) == [1, 2]


def test_an_event_at_the_clock_is_on_time_and_a_duplicate_is_named():
    state = base()  # the clock is 1 (node 1's insert)
    assert accepts(state, Touch((1, 0), 1)).nodes[1].last_access == 1
    rejects(state, Touch((1, 0), 0), "logical time 0 is before the clock 1")
    rejects(state, Free((6, 7, 7)), "duplicate page 7 in one event")


def rejects_exactly(state, event, message):
    """``rejects`` with the whole message (its text is what a replay failure shows)."""
    rejects(state, event, f"rejected: {re.escape(message)}$")


def test_insert_names_each_broken_precondition_exactly():
    plain, paged = base(), base(page_size=2)
    for state, event, message in [
        (plain, Insert(0, (), (), 2, 2, 6), "insert of an empty key"),
        (plain, Insert(0, (100, 9), (6, 7), 2, 2, 6), "node 0 already has a child starting with 100"),
        (plain, Insert(1, (9,), (1,), 2, 2, 6), "page 1 is already in tree node 1"),
        (paged, Insert(0, (9, 9, 9), (12, 13, 14), 2, 2, 6),
         "key length 3 is not a multiple of page size 2"),
        (paged, Insert(0, (9, 9), (13, 12), 2, 2, 6), "slots [13, 12]... are not whole pages in order"),
        (plain, Insert(0, (9,), (8,), 2, 2, 6), "page 8 is not held by owner 6"),
        (plain, Insert(0, (9,), (99,), 2, 2, 6), "page 99 is outside 1..16"),
        (plain, Insert(0, (9,), (6,), 3, 2, 6), "new node id must be 2, got 3"),
        (plain, Insert(7, (9,), (6,), 2, 2, 6), "unknown tree node 7"),
    ]:
        rejects_exactly(state, event, message)


def test_the_rule_tables_follow_a_rule_swapped_in_and_back(monkeypatch):
    """Each backend finds a rule in its mode's table (``rules_for``); a rule swapped into
    ``RULES`` (as the canaries do) must reach states built before the swap, on both
    backends, and the original must come back when the swap is undone."""
    from kvstate.backends.live import LiveState
    from kvstate.rules import RULES
    from kvstate.rules.registry import rules_for

    original = RULES[Allocate]
    calls = []

    def counting(s, event):
        calls.append(event)
        original(s, event)

    state = base()
    live = LiveState.thaw(state)
    with monkeypatch.context() as patch:
        patch.setitem(RULES, Allocate, counting)
        assert RULES[Allocate] is counting
        assert rules_for("radix")[Allocate] is counting and Allocate not in rules_for("block")
        live.apply(Allocate((8,)))
        accepts(state, Allocate((8,)))
    assert len(calls) == 3  # the live state above, and both backends in ``accepts``
    assert rules_for("radix")[Allocate] is original
    live.apply(Allocate((9,)))
    assert len(calls) == 3


def test_a_rule_taken_out_of_rules_leaves_every_table(monkeypatch):
    """Deleting a rule from ``RULES`` takes it out of its mode's table: both backends then
    refuse the event as having no rule, and it comes back with the undo."""
    from kvstate.backends.live import LiveState
    from kvstate.rules import RULES
    from kvstate.rules.registry import rules_for

    state = base()
    live = LiveState.thaw(state)
    with monkeypatch.context() as patch:
        patch.delitem(RULES, Allocate)
        assert Allocate not in rules_for("radix")
        rejects(state, Allocate((8,)), "no rule for Allocate")
        with pytest.raises(InvalidEvent, match="no rule for Allocate"):
            live.apply(Allocate((8,)))
    live.apply(Allocate((8,)))
    accepts(state, Allocate((8,)))


def test_insert_names_a_repeated_page():
    state = apply_all(base(), [Allocate((9,))])
    rejects(state, Insert(0, (7, 8), (9, 9), 2, 2, 0), "duplicate page 9 in one event")
