"""The planner's request flows pinned where the scenarios only see their sum: the slot math of
a batched extend, several requests in one decision, a policy's own victims, a release's
truncation and frees, the block-mode leaves and the seed-002 layout helpers.
"""

from __future__ import annotations

from types import SimpleNamespace

from kvstate import Engine, apply, check
from kvstate import events as ev
from kvstate.events import Allocate, Evict, HostFree, Load, Lock, Offload, Unlock
from kvstate.planner.alloc import extend_slots, last_loc, plan_decode, plan_extend
from kvstate.planner.block import plan_get_new_blocks
from kvstate.planner.builder import PlanBuilder
from kvstate.planner.evict import candidate_leaves, plan_evict, plan_evict_nodes
from kvstate.planner.host import (
    WRITE_BACK,
    WRITE_THROUGH,
    plan_backup,
    plan_host_evict,
    plan_insert_tiered,
    plan_match_tiered,
)
from kvstate.planner.kv_layout import parse_layer_name, prefix_node_of, prefix_tokens_of, seed_id
from kvstate.planner.policy import LeafFIFO, LeafLRU
from kvstate.planner.requests import RequestCursor, plan_checkpoint, plan_release
from kvstate.planner.tree_ops import plan_insert, plan_match
from kvstate.state import DETACHED, ROOT, Geometry, initial_state
from tests.test_engine import GEOMETRY
from tests.test_host_tier import fold, planned, with_tree
from tests.test_planner_choices import _cached_engine, _three_leaf_tree


def test_extend_slots_continue_pages_then_take_fresh_ones_request_by_request():
    # page size 4: (prefix_len, seq_len, last_loc) -> the rest of the partial page, whole
    # fresh pages, a fresh page for the tail; the next request starts after the pages taken
    entries = [(2, 11, 9), (0, 4, -1), (4, 6, 51)]
    assert extend_slots(4, entries, [10, 11, 12, 13]) == [
        [10, 11, 40, 41, 42, 43, 44, 45, 46], [48, 49, 50, 51], [52, 53]]


def test_last_loc_is_the_slot_of_the_last_mapped_position():
    engine = Engine(GEOMETRY)
    engine.apply(ev.ReqAlloc((2,)))
    assert last_loc(engine.view, 2) == -1  # nothing mapped
    with engine.batch() as b:
        plan_extend(b, [(2, 6)], at_head=True)
    second_page = engine.view.requests[2].pages[1]
    assert last_loc(engine.view, 2) == second_page * 4 + 1


def test_one_extend_for_several_requests_takes_exactly_their_pages():
    engine = Engine(GEOMETRY)  # 32 free pages, nothing cached
    engine.apply(ev.ReqAlloc((1, 2)))
    with engine.batch() as b:  # 10 + 22 pages: the whole free list
        slots = plan_extend(b, [(1, 40), (2, 88)], at_head=True)
    assert slots is not None and [len(s) for s in slots] == [40, 88]
    assert len(engine.view.free_pages) == 0
    assert not any(type(e) is ev.Evict for e in engine.events)


def test_one_decode_for_several_requests_takes_a_page_only_at_a_boundary():
    engine = Engine(GEOMETRY)
    engine.apply(ev.ReqAlloc((1, 2, 3)))
    with engine.batch() as b:  # rows at 4, 6 and 8 tokens: 1 + 2 + 2 pages
        plan_extend(b, [(1, 4), (2, 6), (3, 8)], at_head=True)
    free = len(engine.view.free_pages)
    with engine.batch() as b:
        slots = plan_decode(b, [1, 2, 3], at_head=True)
    assert slots is not None and len(engine.view.free_pages) == free - 2  # rows 1 and 3
    assert slots[1] == engine.view.requests[2].pages[1] * 4 + 2


def test_a_policys_own_victims_decide_what_an_extend_evicts():
    engine = _cached_engine()  # one cached node
    leaf = next(iter(engine.view.leaves))
    free = len(engine.view.free_pages)
    engine.apply(ev.ReqAlloc((2,)))
    asked = []

    def victims(state, num_tokens):
        asked.append(num_tokens)
        return [leaf]

    with engine.batch() as b:
        assert plan_extend(b, [(2, (free + 1) * 4)], at_head=False, victims=victims) is not None
    assert asked == [4]  # the deficit in tokens: one page
    assert [e for e in engine.events if type(e) is ev.Evict] == [ev.Evict((leaf,), False)]


def test_evicting_nothing_emits_nothing():
    state = _three_leaf_tree()[0]
    b = PlanBuilder(state)
    assert plan_evict(b, 0, at_head=True) == 0
    assert plan_evict_nodes(b, [], at_head=True) == 0
    assert b.events == []
    assert plan_evict(b, 5, at_head=True) == 8 and len(b.events) == 1


def test_fifo_ranks_by_creation_order_where_lru_ranks_by_access():
    state, b_node, a_node, c_node, d_node, _ = _three_leaf_tree()
    touched = PlanBuilder(state)
    plan_match(touched, [1] * 4 + [2] * 4)  # B (and A) accessed again
    fifo = LeafFIFO()
    assert fifo.priority(state, d_node) == (d_node, d_node)
    assert fifo.victims(touched.state, 100) == [b_node, c_node, a_node, d_node]
    assert LeafLRU().victims(touched.state, 100) == [c_node, d_node, b_node, a_node]


def test_a_retract_that_keeps_the_row_truncates_it_to_the_tree_prefix():
    for at_head in (True, False):
        engine = Engine(GEOMETRY)
        engine.apply(ev.ReqAlloc((2,)))
        with engine.batch() as b:
            plan_extend(b, [(2, 10)], at_head=True)
        pages = list(engine.view.requests[2].pages)
        with engine.batch() as b:
            plan_release(b, RequestCursor(2), list(range(10)), prompt_len=10, owned=10,
                         checkpoint=False, at_head=at_head, close_row=False)
        events = engine.events[-2:]
        assert events[0] == ev.Truncate(2, 0)
        assert events[1] == ev.Free(tuple(pages), at_head)
        assert engine.view.requests[2].pages == []


def test_block_mode_leaves_are_the_childless_unlocked_nodes():
    geometry = Geometry(num_pages=8, page_size=2, num_rows=2, row_width=32, mode="block")
    b = PlanBuilder(apply(initial_state(geometry), ev.ReqAlloc((1,))))
    pages = plan_get_new_blocks(b, 1, 4)
    state = apply(b.state, ev.BlockCache(ROOT, ((1, (1, 1), None, pages[0]),
                                                (2, (2, 2), None, pages[1]),
                                                (3, (3, 3), None, pages[2]))))
    assert candidate_leaves(state) == [3]
    branch = apply(state, ev.BlockCache(1, ((4, (5, 5), None, pages[3]),)))  # a sibling of 2
    assert sorted(candidate_leaves(branch)) == [3, 4]


def test_seed_002_prefix_helpers():
    assert prefix_tokens_of(SimpleNamespace(key=(123, 48, 0))) == 48
    assert prefix_tokens_of(SimpleNamespace(key=(123, 7))) == 7
    assert prefix_tokens_of(SimpleNamespace(key=(123,))) == 1  # a one-token prefix
    state = SimpleNamespace(requests={"a": SimpleNamespace(pages=[5]), "b": SimpleNamespace(pages=[]),
                                      "c": SimpleNamespace(pages=[6]), "r": SimpleNamespace(pages=[7])},
                            page_node={5: 9, 7: ROOT})
    assert prefix_node_of(state, "a") == 9
    assert prefix_node_of(state, "b") is None  # no page yet
    assert prefix_node_of(state, "c") is None  # its page is not cached
    assert prefix_node_of(state, "r") is None  # the root is no prefix node


def _host_chain():
    """Host tier (write-through, P=2): node 1 = [1..8] on device pages 1..4, its child
    node 2 = [9, 10] on page 5 and node 3 = [20, 21] on page 6; all backed up."""
    state = fold(with_tree(WRITE_THROUGH), Allocate((5, 6)))
    state, _, _ = planned(state, plan_insert_tiered, list(range(1, 11)), list(range(2, 12)), 0,
                          policy=WRITE_THROUGH, at_head=True)
    state, _, _ = planned(state, plan_insert_tiered, [20, 21], [12, 13], 0,
                          policy=WRITE_THROUGH, at_head=True)
    return state


def test_loading_a_child_locks_its_device_parent_while_making_room():
    state = fold(_host_chain(), Evict((2,), True))  # node 2 is host-only, page 5 free
    state = fold(state, Allocate(tuple(state.free_pages.head(len(state.free_pages)))))
    for at_head in (True, False):
        after, events, result = planned(state, plan_match_tiered, list(range(1, 11)),
                                        policy=WRITE_THROUGH, at_head=at_head)
        assert result.length == 10 and check(after) == []
        # the parent (node 1) is pinned while node 3 is evicted for the load's page
        assert events[1:5] == [Lock(1), Evict((3,), at_head), Unlock(1),
                               Load(2, tuple(after.nodes[2].pages), events[0].time + 1)]


def test_host_eviction_frees_lru_leaves_then_their_emptied_parents():
    state = fold(_host_chain(), Evict((2,), True), Evict((1,), True))  # host-only chain 1 -> 2
    assert len(state.host.free_pages) == 2  # node 3's backup holds one more
    assert planned(state, plan_host_evict, 2)[1] == []  # already free
    assert planned(state, plan_host_evict, 3)[1] == [HostFree((2,))]
    both = [HostFree((2,)), HostFree((1,))]
    assert planned(state, plan_host_evict, 7)[1] == both  # 1 becomes a leaf once 2 is gone
    assert planned(state, plan_host_evict, 8)[1] == both  # all there is (3 is on the device)


def test_a_backup_covers_the_node_and_its_unbacked_ancestors():
    state = with_tree(WRITE_BACK)  # node 1 not backed up
    assert planned(state, plan_backup, ROOT)[1:] == ([], True)
    after, events, done = planned(state, plan_backup, 1)
    assert done and events == [Offload(1, (0, 1, 2, 3))]
    assert planned(after, plan_backup, 1)[1:] == ([], True)  # already backed up
    full = with_tree(WRITE_BACK, host_pages=3)  # 4 pages do not fit on 3
    assert planned(full, plan_backup, 1)[1:] == ([], False)


def test_seed_002_core_names_parse_back():
    assert seed_id("req/abc") == "abc" and seed_id("req/") == ""
    for other in ("L0/abc", "abc", 7, None, "REQ/abc"):
        assert seed_id(other) is None
    assert parse_layer_name("L0/abc") == (0, "abc")
    assert parse_layer_name("L12/a/b") == (12, "a/b")  # the seed id may hold a slash
    for other in ("req/abc", "L/abc", "Lx/abc", "L3", "l3/abc", 3, None, "L-1/abc"):
        assert parse_layer_name(other) is None


def test_extend_slots_stay_in_the_partial_page_when_the_extend_fits_there():
    # prefix 2, seq 3 at page size 4: one slot after last_loc 9, no fresh page
    assert extend_slots(4, [(2, 3, 9), (0, 2, -1)], [10, 11]) == [[10], [40, 41]]


def test_an_insert_below_a_split_counts_the_whole_matched_prefix():
    engine = Engine(GEOMETRY)
    engine.apply(ev.Allocate((1, 2, 3, 4, 5, 6)))
    with engine.batch() as b:
        first = plan_insert(b, [1, 2, 3, 4], None, DETACHED, pages=[1])
        second = plan_insert(b, list(range(1, 13)), None, DETACHED, pages=[1, 2, 3])
        # walks all of [1..4], then splits [5..12] after 4 tokens: 8 tokens were cached
        third = plan_insert(b, [*range(1, 9), 77, 78, 79, 80], None, DETACHED, pages=[1, 4, 5])
        short = plan_insert(b, [1, 2, 3], None, DETACHED, pages=[])  # less than a page
    assert (first.prefix_len, second.prefix_len, third.prefix_len) == (0, 4, 8)
    assert (short.prefix_len, short.last_node) == (0, ROOT)
    keys = {node.key: node.parent for node in engine.view.nodes.values()}
    top = next(i for i, n in engine.view.nodes.items() if n.key == (1, 2, 3, 4))
    middle = next(i for i, n in engine.view.nodes.items() if n.key == (5, 6, 7, 8))
    assert keys[(5, 6, 7, 8)] == top and keys[(9, 10, 11, 12)] == middle
    assert keys[(77, 78, 79, 80)] == middle


def test_a_checkpoint_splits_the_prompt_from_the_output_and_frees_duplicates():
    engine = Engine(GEOMETRY)
    engine.apply(ev.ReqAlloc((1, 2)))
    tokens = list(range(1, 13))  # an 8-token prompt and 4 output tokens
    with engine.batch() as b:
        plan_extend(b, [(1, 12), (2, 12)], at_head=True)
    with engine.batch() as b:
        cursor = plan_checkpoint(b, RequestCursor(1), tokens, prompt_len=8, up_to=12,
                                 at_head=True)
    keys = sorted(node.key for node in engine.view.nodes.values() if node.key)
    assert keys == [(1, 2, 3, 4, 5, 6, 7, 8), (9, 10, 11, 12)]  # the output part apart
    assert cursor.protected_len == 12
    own = tuple(engine.view.requests[2].pages)
    before = len(engine.events)
    with engine.batch() as b:  # the same tokens again: request 2's pages are duplicates
        plan_checkpoint(b, RequestCursor(2), tokens, prompt_len=8, up_to=12, at_head=True)
    frees = [e for e in engine.events[before:] if type(e) is ev.Free]
    assert frees == [ev.Free(own, True)]
    assert engine.view.requests[2].pages == engine.view.requests[1].pages
