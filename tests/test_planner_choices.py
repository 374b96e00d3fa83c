"""The planner's choices pinned one by one: where an eviction's pages go, which slots a decode
takes, what a policy counts, how a policy is loaded, the codes of the seed-002 layout.

Each test names a choice the front ends' scenarios only reach through its effects (a mutation
run of ``kvstate/planner`` found them unpinned).
"""

from __future__ import annotations

import sys
import uuid
from types import SimpleNamespace

import pytest

from kvstate import Engine, apply, check
from kvstate import events as ev
from kvstate.events import Allocate, Evict, Load, Offload
from kvstate.planner.alloc import decode_slots, plan_decode, plan_extend
from kvstate.planner.block import allocation_is_idle, plan_get_new_blocks, plan_touch
from kvstate.planner.block_hits import cached_prefix
from kvstate.planner.builder import PlanBuilder
from kvstate.planner.evict import eviction_order
from kvstate.planner.host import WRITE_BACK, WRITE_THROUGH, plan_insert_tiered, plan_match_tiered
from kvstate.planner.kv_layout import find_prefix, prefix_code, prefix_key
from kvstate.planner.kv_manager import (
    plan_open_with_prefix,
    plan_paged_append,
    plan_paged_close,
    plan_paged_open,
    plan_reserve,
)
from kvstate.planner.policy import LeafLFU, PolicyError, load_policy, require_policy
from kvstate.planner.requests import pages_of_segment
from kvstate.planner.tree_ops import plan_insert, plan_match, prefix_length
from kvstate.state import DETACHED, ROOT, Geometry, initial_state
from tests.test_engine import GEOMETRY, _run
from tests.test_host_tier import fold, planned, with_tree
from tests.test_kv_manager_planner import LAYERS, paged_state, run


def test_decode_slots_take_fresh_pages_in_order():
    # page size 4: a request at a page boundary opens the next fresh page, the others
    # continue their partial page
    entries = [(4, 15), (5, 16), (8, 31), (12, 47)]
    assert decode_slots(4, entries, [7, 9, 11]) == [28, 17, 36, 44]


def _cached_engine() -> Engine:
    """Two finished requests' prompt in the tree, no request open."""
    engine = Engine(GEOMETRY)
    _run(engine)
    assert engine.view.nodes and not engine.view.requests
    return engine


@pytest.mark.parametrize("at_head", [True, False])
def test_an_extend_evicts_its_deficit_with_the_callers_queue_end(at_head):
    engine = _cached_engine()
    free = len(engine.view.free_pages)
    engine.apply(ev.ReqAlloc((2,)))
    with engine.batch() as b:
        slots = plan_extend(b, [(2, (free + 1) * GEOMETRY.page_size)], at_head=at_head)
    assert slots is not None
    evicts = [e for e in engine.events if type(e) is ev.Evict]
    assert len(evicts) == 1 and evicts[0].at_head is at_head


@pytest.mark.parametrize("at_head", [True, False])
def test_a_decode_evicts_its_deficit_with_the_callers_queue_end(at_head):
    engine = _cached_engine()
    free = len(engine.view.free_pages)
    engine.apply(ev.ReqAlloc((2,)))
    with engine.batch() as b:  # fill every free page, leaving the row at a page boundary
        assert plan_extend(b, [(2, free * GEOMETRY.page_size)], at_head=True) is not None
    assert not any(type(e) is ev.Evict for e in engine.events)  # an exact fit evicts nothing
    with engine.batch() as b:
        assert plan_decode(b, [2], at_head=at_head) is not None
    evicts = [e for e in engine.events if type(e) is ev.Evict]
    assert len(evicts) == 1 and evicts[0].at_head is at_head


def test_touch_skips_the_null_block():
    geometry = Geometry(num_pages=8, page_size=4, num_rows=2, row_width=32, mode="block")
    b = PlanBuilder(initial_state(geometry))
    plan_touch(b, [3, 0, 5])
    plan_touch(b, [0])  # nothing real to hold: no event
    plan_touch(b, [6])
    assert b.events == [ev.BlockHold(DETACHED, (3, 5)), ev.BlockHold(DETACHED, (6,))]
    assert b.done(None).base is not b.state


def test_lfu_counts_touches_splits_and_forgets_evictions():
    policy = LeafLFU()
    policy.observe([ev.Touch((1, 2), 5), ev.Touch((2,), 6)])
    policy.observe([ev.Split(2, 1, 7, 8), ev.Split(9, 1, 10, 8)])  # 9 was never counted
    assert policy.counts == {1: 1, 2: 2, 7: 2, 10: 0}
    policy.observe([ev.Evict((7, 11))])  # 11 was never counted either
    assert policy.counts == {1: 1, 2: 2, 10: 0}
    engine = _cached_engine()
    leaf = next(iter(engine.view.leaves))
    assert LeafLFU().priority(engine.view, leaf)[0] == 0  # never touched: no access yet


class NoObserve:
    def victims(self, state, num_tokens):
        return []

    def at_head(self, state):
        return True


class Broken:
    def __init__(self):
        raise ValueError("no config")


def test_a_policy_lacking_a_method_is_refused_in_one_line():
    with pytest.raises(PolicyError) as caught:
        require_policy(NoObserve())
    assert str(caught.value) == (
        "policy: NoObserve lacks observe(events); subclass kvstate.planner.policy.LeafPolicy "
        "(override priority) or define all three")
    with pytest.raises(PolicyError) as caught:
        require_policy(object(), "policy 'x'")
    assert str(caught.value).startswith(
        "policy 'x': object lacks victims(state, num_tokens), at_head(state), observe(events);")
    assert require_policy(LeafLFU()).__class__ is LeafLFU


def test_load_policy_messages_name_the_module_and_the_class():
    with pytest.raises(PolicyError) as caught:
        load_policy("kvstate.planner.policy:LeafLRU:x")  # the class is everything after the first ':'
    assert str(caught.value) == ("policy 'kvstate.planner.policy:LeafLRU:x': "
                                 "'kvstate.planner.policy' has no 'LeafLRU:x'")
    with pytest.raises(PolicyError) as caught:
        load_policy("tests.test_planner_choices:Broken")
    assert str(caught.value) == ("policy 'tests.test_planner_choices:Broken': Broken() failed: "
                                 "ValueError: no config")
    with pytest.raises(PolicyError) as caught:
        load_policy("tests.test_planner_choices:NoObserve")
    assert str(caught.value).startswith(
        "policy 'tests.test_planner_choices:NoObserve': NoObserve lacks observe(events);")


def test_load_policy_finds_a_file_in_the_working_directory(tmp_path, monkeypatch):
    # a name no earlier test (or forked test process) can have imported already
    module = f"choice_policy_{uuid.uuid4().hex}"
    (tmp_path / f"{module}.py").write_text(
        "from kvstate.planner.policy import LeafLRU\n\nclass Mine(LeafLRU):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    before = list(sys.path)
    try:
        policy = load_policy(f"{module}:Mine")
    finally:
        sys.modules.pop(module, None)
    assert type(policy).__name__ == "Mine"
    assert sys.path == before  # the working directory is taken off the path again


def test_prefix_codes_are_stable():
    # a seed-002 prefix node's key is derived from the prefix hash: logs depend on these values
    assert prefix_code("system-prompt-v1") == 985653785622670449
    assert prefix_code("é") == 3394012004367669963
    assert prefix_key("p", 48, 4) == (2263608060651336205, 48, 0, 0)
    assert prefix_key("p", 48, 1) == (2263608060651336205,)


@pytest.mark.parametrize("policy", [WRITE_THROUGH, WRITE_BACK])
@pytest.mark.parametrize("at_head", [True, False])
def test_a_host_load_makes_room_under_the_callers_policy(policy, at_head):
    """Loading a host-only node back evicts a device node for room: with the caller's queue
    end, and under write-back after backing that node up (so it stays on the host)."""
    state = with_tree(policy)
    if policy == WRITE_BACK:  # write-back did not back node 1 up on insert
        state = fold(state, Offload(1, (0, 1, 2, 3)))
    state = fold(state, Evict((1,), True))  # node 1 ([1..8]) is host-only now
    state = fold(state, Allocate((1, 2, 3)))
    state, _, _ = planned(state, plan_insert_tiered, [20, 21, 22, 23, 24, 25], [2, 3, 4, 5, 6, 7],
                          0, policy=policy, at_head=True)  # node 2 on device pages 1..3
    after, events, result = planned(state, plan_match_tiered, [1, 2, 3, 4, 5, 6, 7, 8],
                                    policy=policy, at_head=at_head)
    assert result.length == 8
    evicts = [e for e in events if type(e) is Evict]
    assert evicts == [Evict((2,), at_head)]
    loads = [index for index, e in enumerate(events) if type(e) is Load]
    assert len(loads) == 1
    assert events[loads[0]].time == fold(state, *events[:loads[0]]).clock + 1
    assert 2 in after.host.evicted  # backed up before it left the device
    assert check(after) == []
    if policy == WRITE_BACK:
        assert any(type(e) is Offload and e.node == 2 for e in events)


def test_prefix_length_counts_a_partly_matched_node_to_its_page():
    view = _cached_engine().view  # one node: tokens 1..12, page size 4
    prompt = list(range(1, 14))
    assert prefix_length(view, prompt) == 12
    assert prefix_length(view, prompt[:6] + [500, 501]) == 4  # splits inside the node
    assert prefix_length(view, [1, 2, 3]) == 0  # shorter than a page
    assert prefix_length(view, [7, 7, 7, 7]) == 0


@pytest.mark.parametrize(("limit", "length"), [(None, 12), (100, 12), (13, 12), (9, 8),
                                               (3, 0), (-5, 0)])
def test_a_match_limit_is_clamped_to_the_key_and_aligned(limit, length):
    engine = _cached_engine()
    with engine.batch() as b:
        result = plan_match(b, list(range(1, 14)), limit=limit)
    assert result.length == length and len(result.pages) == length // GEOMETRY.page_size
    if not length:
        assert result.pages == () and result.last_node == ROOT


def test_pages_of_segment_are_the_pages_under_the_positions():
    engine = Engine(GEOMETRY)
    engine.apply(ev.ReqAlloc((2,)))
    with engine.batch() as b:
        plan_extend(b, [(2, 10)], at_head=True)
    table = list(engine.view.requests[2].pages)
    assert len(table) == 3
    assert pages_of_segment(engine.view, 2, 5, 9) == table[1:3]
    assert pages_of_segment(engine.view, 2, 0, 4) == table[:1]
    assert pages_of_segment(engine.view, 2, 0, 10) == table
    assert pages_of_segment(engine.view, 2, 5, 5) == []
    assert pages_of_segment(engine.view, 2, 6, 2) == []


def _retained_prefix(pages: int):
    """A seed-002 paged state whose request "a" closed, leaving prefix "h" retained."""
    state = paged_state(pages)
    _, _, state = run(state, plan_open_with_prefix, "a", LAYERS, "h", 4, 0, 0)
    _, _, state = run(state, plan_paged_close, "a", LAYERS)
    return state


def test_the_seed_002_planner_evicts_to_the_head_of_the_free_list():
    # every eviction of the seed-002 manager puts the freed pages first, so they are reused
    # next: an open on another prefix, a plain open, an append that needs a page
    state = _retained_prefix(6)
    _, events, _ = run(state, plan_open_with_prefix, "b", LAYERS, "g", 4, 8, 0)
    assert [e for e in events if type(e) is Evict] == [Evict((1,), True)]
    _, events, _ = run(state, plan_paged_open, "b", LAYERS, 12, 0)
    assert [e for e in events if type(e) is Evict] == [Evict((1,), True)]
    _, _, state = run(state, plan_paged_open, "x", LAYERS, 8, 0)  # the free list is empty now
    for _ in range(8):  # the table's pages fill; the ninth token needs a page
        _, events, state = run(state, plan_paged_append, "x", 0, 0)
        assert not any(type(e) is Evict for e in events)
    _, events, state = run(state, plan_paged_append, "x", 0, 0)
    assert [type(e) for e in events] == [Evict, Allocate, ev.Append]
    assert events[0] == Evict((1,), True) and check(state) == []


def _three_leaf_tree():
    """Page size 4: A=[1]*4 under the root with children B=[2]*4 and C=[3]*4, and D=[9]*4
    under the root, inserted in that order (LRU: B, A, C, D; A is no leaf)."""
    geometry = Geometry(num_pages=16, page_size=4, num_rows=4, row_width=64)
    b = PlanBuilder(apply(initial_state(geometry), Allocate((1, 2, 3, 4, 5, 6))))

    def slots(pages):
        return [page * 4 + k for page in pages for k in range(4)]

    plan_insert(b, [1] * 4 + [2] * 4, slots([1, 2]), DETACHED)
    plan_insert(b, [1] * 4 + [3] * 4, slots([1, 3]), DETACHED)
    plan_insert(b, [9] * 4, slots([4]), DETACHED)
    nodes = {node.key: node_id for node_id, node in b.state.nodes.items()}
    return b.state, nodes[(2,) * 4], nodes[(1,) * 4], nodes[(3,) * 4], nodes[(9,) * 4], slots


def test_eviction_order_covers_the_tokens_and_frees_parents_after_their_children():
    state, b_node, a_node, c_node, d_node, slots = _three_leaf_tree()
    assert eviction_order(state, 1) == eviction_order(state, 4) == [b_node]
    assert eviction_order(state, 5) == eviction_order(state, 8) == [b_node, c_node]
    # A becomes a leaf once both children are gone, and its LRU time is older than D's
    assert eviction_order(state, 12) == [b_node, c_node, a_node]
    assert eviction_order(state, 100) == [b_node, c_node, a_node, d_node]
    # a leaf a request maps is passed over, and the walk goes on to the next one
    mapped = apply(apply(state, ev.ReqAlloc((1,))), ev.Assign(1, 0, tuple(slots([1, 2]))))
    assert eviction_order(mapped, 4) == [c_node]
    assert eviction_order(mapped, 100) == [c_node, d_node]


def test_an_allocation_is_idle_only_when_the_table_covers_it_and_nothing_new_is_full():
    geometry = Geometry(num_pages=8, page_size=4, num_rows=2, row_width=32, mode="block")
    b = PlanBuilder(apply(initial_state(geometry), ev.ReqAlloc((1,))))
    plan_get_new_blocks(b, 1, 2)  # request 1's table: 2 blocks, 8 slots
    state = b.state

    def idle(need, upto=8, keys=2, cached=None, caching=True, request=1):
        chain = SimpleNamespace(block_keys=[object()] * keys)
        running = None if cached is None else SimpleNamespace(num_cached=cached)
        return allocation_is_idle(state, request, chain, running, need_slots=need,
                                  cache_upto=upto, caching=caching)

    assert not idle(8, caching=False, request=2)  # no such request: plan in full
    assert idle(8, caching=False) and not idle(9, caching=False)  # the table would grow
    assert not idle(8) and not idle(8, cached=1) and idle(8, cached=2)  # 2 full blocks to cache
    assert idle(8, upto=7, cached=1)  # 7 tokens: one full block
    assert not idle(8, upto=100, keys=3, cached=2)  # 3 hashed blocks cap what can be cached
    assert idle(8, upto=100, keys=1, cached=1)


def test_a_hollow_block_ends_a_full_attention_hit_but_not_a_window_scan():
    geometry = Geometry(num_pages=8, page_size=2, num_rows=2, row_width=32, mode="block")
    b = PlanBuilder(apply(initial_state(geometry), ev.ReqAlloc((1,))))
    pages = plan_get_new_blocks(b, 1, 3)
    # chain positions 1..3; position 2 keeps its place without a copy (hollow)
    state = apply(b.state, ev.BlockCache(ROOT, ((1, (1, 1), None, pages[0]),
                                                (2, (2, 2), None, 0),
                                                (3, (3, 3), None, pages[2]))))
    chain = SimpleNamespace(block_keys=[(1, 1), (2, 2), (3, 3), (4, 4)])
    for max_blocks in (1, 3, 4):
        assert cached_prefix(state, chain, max_blocks, None) == [pages[0]]
    assert cached_prefix(state, chain, 1, 2) == [pages[0]]
    for window in (2, 3):  # one block of window: the last cached copy is the hit's end
        assert cached_prefix(state, chain, 3, window) == [0, 0, pages[2]]
        assert cached_prefix(state, chain, 4, window) == [0, 0, pages[2]]
    assert cached_prefix(state, chain, 4, 5) == [pages[0]]  # two blocks: only the run at the start


def test_reusing_a_prefix_evicts_the_others_first_even_when_it_is_older():
    state = _retained_prefix(8)  # "h", then a newer "g"
    _, _, state = run(state, plan_open_with_prefix, "c", LAYERS, "g", 4, 0, 0)
    _, _, state = run(state, plan_paged_close, "c", LAYERS)
    h_node, g_node = find_prefix(state, "h"), find_prefix(state, "g")
    result, events, after = run(state, plan_open_with_prefix, "b", LAYERS, "h", 4, 12, 0)
    assert result is False  # "h" reused
    assert [e for e in events if type(e) is Evict] == [Evict((g_node,), True)]
    assert find_prefix(after, "h") == h_node and find_prefix(after, "g") is None


def test_a_reservation_may_take_every_free_page():
    state = initial_state(Geometry(num_pages=6, row_width=6))
    assert run(state, plan_reserve, "a", LAYERS, 6, 0)[0] is True
    assert run(state, plan_reserve, "a", LAYERS, 7, 0)[:2] == (False, ())


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_checkpoint_rewrites_the_row_only_where_the_tree_kept_other_pages(page_size):
    """``rewrite_row``: a request that checkpoints a prompt new to the tree keeps its row as it
    is (no ``Assign``); one whose prompt another request cached first frees its copies and
    points its row at the tree's pages (one ``Assign`` of the tree's slots)."""
    from kvstate.sglang.hybrid_req import HybridReq
    from kvstate.sglang.hybrid_scheduler import admit, prefill_done
    from tools.hybrid_sides import Side

    side = Side("kvstate", "-", page_size, 4 * page_size)
    engine, pool = side.cache.engine, side.pool
    prompt = list(range(1, 4 * page_size + 2))
    first, second = HybridReq(0, prompt), HybridReq(1, prompt)
    admit(side.cache, first)
    admit(side.cache, second)  # admitted before the first one cached anything: no hit
    rows = [int(req.kv.req_pool_idx) for req in (first, second)]
    before = [pool.req_to_token[row, :len(prompt)].tolist() for row in rows]
    start = len(engine.events)
    prefill_done(side.cache, first, 7)
    assert not [e for e in engine.events[start:] if type(e) is ev.Assign]
    assert pool.req_to_token[rows[0], :len(prompt)].tolist() == before[0]
    start = len(engine.events)
    prefill_done(side.cache, second, 7)
    cached = len(prompt) // page_size * page_size
    assigns = [e for e in engine.events[start:] if type(e) is ev.Assign]
    assert [(e.request, e.start, e.slots) for e in assigns] == \
        [(rows[1], 0, tuple(before[0][:cached]))]
    assert pool.req_to_token[rows[1], :cached].tolist() == before[0][:cached]
    assert check(engine.state) == []
