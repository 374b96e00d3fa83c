"""Canaries: every property is live.

For each ALWAYS and TRANSITIONS property in ``specs.invariants`` (and each
planner-level property) there is a deliberately broken variant of one rule.
The explorer must catch it in a tiny scope *with only that property
registered and the spec model off* (so the catch is that property's own),
and the hypothesis state machine must catch it too.  The classic real bugs
are among the variants: an off-by-one in the partial-page fill, a lock not
released on finish, evicting a node whose child is locked, a refcount not
decremented on a duplicate free, a split that does not copy ``lock_ref``, a
free that appends a page twice, and a stale prefix hit after eviction.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test
from immutables import Map

import specs.invariants as spec
from kvstate import events as ev
from kvstate.checking import SCOPES, EventLevel, PlannerLevel, explore
from kvstate.checking.scopes import Scope
from kvstate.reducer import HANDLERS, Reject
from kvstate.state import Request
from kvstate.testing.machine import SpecMachine

CANARY_SCOPE = Scope("canary", "event", num_pages=2, page_size=1, num_rows=2, vocab=2,
                     max_depth=5, max_key_pages=2)
PAGED_SCOPE = Scope("canary-paged", "event", num_pages=2, page_size=2, num_rows=2, vocab=2,
                    max_depth=5, max_key_pages=2)
MACHINE_SETTINGS = settings(max_examples=1000, stateful_step_count=30, deadline=None,
                            derandomize=True, database=None, phases=[Phase.generate],
                            report_multiple_bugs=False)


def _core(event_type):
    return HANDLERS[event_type]


# -- broken variants: (property, event type, factory(core rule) -> broken rule) ---------
def free_keeps_holder(core):
    def rule(state, e):
        out = core(state, e)
        return out.with_changes(holders=out.holders.set(e.pages[0], (0,)))
    return rule


def evict_frees_shared_pages(core):
    """A free that appends a page twice: eviction also frees pages a request still holds."""
    def rule(state, e):
        out = core(state, e)
        held = [p for n in e.nodes for p in state.nodes[n].pages if p in state.holders]
        return out.with_changes(free_pages=out.free_pages.push_tail(held)) if held else out
    return rule


def truncate_keeps_hold(core):
    """A refcount not decremented: the dropped page keeps the request as its holder."""
    def rule(state, e):
        out = core(state, e)
        return out.with_changes(holders=state.holders)
    return rule


def req_alloc_keeps_row_free(core):
    def rule(state, e):
        return core(state, e).with_changes(free_rows=state.free_rows)
    return rule


def lock_skips_sizes(core):
    def rule(state, e):
        return core(state, e).with_changes(evictable_size=state.evictable_size,
                                           protected_size=state.protected_size)
    return rule


def lock_keeps_leaf_index(core):
    """Locking a leaf leaves it in the evictable-leaf index (eviction could pick it)."""
    def rule(state, e):
        return core(state, e).with_changes(leaves=state.leaves)
    return rule


def split_drops_lock_ref(core):
    """A split that does not copy lock_ref to the new top node."""
    def rule(state, e):
        out = core(state, e)
        top = out.nodes[e.new_node]
        return out.with_changes(nodes=out.nodes.set(e.new_node, top._replace(lock_ref=0)))
    return rule


def insert_skips_child_index(core):
    def rule(state, e):
        out = core(state, e)
        parent = out.nodes[e.parent]
        old_children = state.nodes[e.parent].children
        return out.with_changes(nodes=out.nodes.set(e.parent, parent._replace(children=old_children)))
    return rule


def allocate_overcounts(core):
    def rule(state, e):
        out = core(state, e)
        if not e.items:
            return out
        rid = e.items[0][0]
        record = out.requests[rid]
        grown = Request(record.pages, record.allocated + 1, record.committed)
        return out.with_changes(requests=out.requests.set(rid, grown))
    return rule


def touch_keeps_clock(core):
    def rule(state, e):
        return core(state, e).with_changes(clock=state.clock)
    return rule


def touch_stamps_everything(core):
    def rule(state, e):
        out = core(state, e)
        nodes = out.nodes
        for node_id, node in out.nodes.items():
            nodes = nodes.set(node_id, node._replace(last_access=e.time))
        return out.with_changes(nodes=nodes)
    return rule


def evict_ignores_locks(core):
    """Evicting a node whose child is locked: no lock or leaf check; the subtree goes too."""
    def rule(state, e):
        nodes, page_node, queue = state.nodes, state.page_node, state.free_pages
        for node_id in e.nodes:
            if node_id == 0 or node_id not in nodes:
                raise Reject(f"cannot evict node {node_id}")
            node = nodes[node_id]
            parent = nodes[node.parent]
            key = state.geometry.child_key(node.key)
            nodes = nodes.set(node.parent, parent._replace(children=parent.children.delete(key)))
            subtree = [node_id]
            for member in subtree:
                subtree.extend(nodes[member].children.values())
            for member in subtree:
                for page in nodes[member].pages:
                    page_node = page_node.delete(page)
                queue = queue.push_tail([p for p in nodes[member].pages if p not in state.holders])
                nodes = nodes.delete(member)
        return state.with_changes(nodes=nodes, page_node=page_node, free_pages=queue)
    return rule


def evict_leaves_node(core):
    """A stale prefix hit after eviction: pages go free but the node stays in the tree."""
    def rule(state, e):
        out = core(state, e)
        return out.with_changes(nodes=state.nodes, page_node=state.page_node)
    return rule


def req_free_truncates_others(core):
    def rule(state, e):
        out = core(state, e)
        requests = out.requests
        for rid, record in out.requests.items():
            if record.allocated:
                requests = requests.set(rid, Request(record.pages, 0, 0))
        return out.with_changes(requests=requests)
    return rule


def share_skips_holder(core):
    def rule(state, e):
        return core(state, e).with_changes(holders=state.holders)
    return rule


def touch_moves_clock_back(core):
    def rule(state, e):
        return core(state, e).with_changes(clock=max(0, state.clock - 1))
    return rule


def evict_ignores_mapping(core):
    """Eviction checks locks and leaves but not whether a request still maps the pages (F1).

    The real rule run on a view of the state with its ``tree_refs`` index hidden;
    the index is restored afterwards (eviction never changes it).
    """
    def rule(state, e):
        return core(state.with_changes(tree_refs=Map()), e).with_changes(tree_refs=state.tree_refs)
    return rule


def share_allows_mapped_page(core):
    """Share accepts a page the request already maps (F5): one slot at two positions."""
    def rule(state, e):
        record = state.requests.get(e.request)
        size = state.geometry.page_size
        pages = sorted({slot // size for slot in e.slots})
        if record is None or not pages or any(p not in record.pages for p in pages):
            return core(state, e)
        holders = state.holders
        for page in pages:
            held = holders.get(page, ())
            if e.request not in held:
                holders = holders.set(page, (*held, e.request))
        grown = Request(record.pages.extend(pages), record.allocated + len(e.slots),
                        record.committed)
        return state.with_changes(holders=holders, requests=state.requests.set(e.request, grown))
    return rule


EVENT_CANARIES: dict[str, tuple[str, type[ev.Event], Callable, Scope]] = {
    "free-keeps-holder": ("conservation", ev.Free, free_keeps_holder, CANARY_SCOPE),
    "free-appends-page-twice": ("conservation", ev.Evict, evict_frees_shared_pages, CANARY_SCOPE),
    "stale-prefix-hit-after-eviction": ("conservation", ev.Evict, evict_leaves_node, CANARY_SCOPE),
    "refcount-not-decremented": ("refcounts", ev.Truncate, truncate_keeps_hold, CANARY_SCOPE),
    "row-handed-out-twice": ("reserved_ids", ev.ReqAlloc, req_alloc_keeps_row_free, CANARY_SCOPE),
    "lock-skips-size-accounting": ("tree_sizes", ev.Lock, lock_skips_sizes, CANARY_SCOPE),
    "lock-keeps-leaf-index": ("leaf_index", ev.Lock, lock_keeps_leaf_index, CANARY_SCOPE),
    "split-drops-lock-ref": ("lock_monotonic", ev.Split, split_drops_lock_ref, CANARY_SCOPE),
    "insert-skips-child-index": ("node_shape", ev.Insert, insert_skips_child_index, CANARY_SCOPE),
    "allocate-overcounts": ("request_lengths", ev.Allocate, allocate_overcounts, CANARY_SCOPE),
    "evict-mapped-page (F1)": ("table_refs_live", ev.Evict, evict_ignores_mapping, CANARY_SCOPE),
    "touch-keeps-clock": ("clock", ev.Touch, touch_keeps_clock, CANARY_SCOPE),
    "share-page-twice (F5)": ("table_injective", ev.Share, share_allows_mapped_page,
                              CANARY_SCOPE),
    "touch-stamps-unnamed-nodes": ("frame", ev.Touch, touch_stamps_everything, CANARY_SCOPE),
    "evict-node-with-locked-child": ("evict_locked", ev.Evict, evict_ignores_locks, CANARY_SCOPE),
    "free-changes-other-tables": ("free_isolation", ev.ReqFree, req_free_truncates_others,
                                  CANARY_SCOPE),
    "share-skips-refcount": ("refcount_delta", ev.Share, share_skips_holder, PAGED_SCOPE),
    "touch-moves-clock-back": ("clock_monotone", ev.Touch, touch_moves_clock_back, CANARY_SCOPE),
}


def test_every_property_has_a_canary():
    covered = {target for target, *_ in EVENT_CANARIES.values()}
    assert covered == set(spec.ALWAYS) | set(spec.TRANSITIONS)


@pytest.fixture
def broken(request, monkeypatch):
    """Break one rule of the core; register only the target property."""
    target, event_type, factory, _ = EVENT_CANARIES[request.param]
    monkeypatch.setitem(HANDLERS, event_type, factory(HANDLERS[event_type]))
    monkeypatch.setattr(spec, "ALWAYS", {k: v for k, v in spec.ALWAYS.items() if k == target})
    monkeypatch.setattr(spec, "TRANSITIONS",
                        {k: v for k, v in spec.TRANSITIONS.items() if k == target})
    return request.param


@pytest.mark.parametrize("broken", sorted(EVENT_CANARIES), indirect=True)
def test_explorer_catches(broken):
    target, _, _, scope = EVENT_CANARIES[broken]
    report = explore(EventLevel(scope, check_model=False), probes=())
    assert report.violation is not None, f"{broken} went unnoticed"
    assert report.violation.names == (target,)
    assert len(report.violation.events()) <= scope.max_depth


class _CanaryMachine(SpecMachine):
    check_model = False


@pytest.mark.parametrize("broken", sorted(EVENT_CANARIES), indirect=True)
def test_state_machine_catches(broken, tmp_path):
    target = EVENT_CANARIES[broken][0]
    _CanaryMachine.log_dir = str(tmp_path)
    with pytest.raises(AssertionError, match=rf"\[{target}\]"):
        run_state_machine_as_test(_CanaryMachine, settings=MACHINE_SETTINGS)


# -- planner-level canaries ---------------------------------------------------------------
def _off_by_one_extend_slots(real):
    """The old partial page is filled from ``last_loc + 2``: an off-by-one in part 1."""
    def broken(page_size, entries, free_pages):
        out = real(page_size, entries, free_pages)
        for (prefix_len, _seq_len, last_loc), slots in zip(entries, out, strict=True):
            if prefix_len % page_size and slots:
                slots[0] = last_loc + 2
        return out
    return broken


def _release_keeps_lock(real):
    """A lock not released on finish: the plan's Unlock is dropped."""
    from kvstate.planner.builder import PlanBuilder

    def broken(state, cursor, *args, **kwargs):
        plan = real(state, cursor, *args, **kwargs)
        builder = PlanBuilder(state)
        for event in plan.events:
            if not isinstance(event, ev.Unlock):
                builder.emit(event)
        return builder.done(plan.result)
    return broken


def test_explorer_catches_partial_fill_off_by_one(monkeypatch):
    import kvstate.planner.alloc as alloc

    monkeypatch.setattr(alloc, "extend_slots", _off_by_one_extend_slots(alloc.extend_slots))
    report = explore(PlannerLevel(SCOPES["planner-paged"], check_model=False), max_depth=3,
                     probes=())
    assert report.violation is not None
    assert report.violation.names == ("planner_valid",)


def test_explorer_catches_lock_not_released_on_finish(monkeypatch):
    import kvstate.checking.planner_level as pl

    monkeypatch.setattr(pl, "plan_release", _release_keeps_lock(pl.plan_release))
    report = explore(PlannerLevel(SCOPES["planner"], check_model=False), max_depth=3, probes=())
    assert report.violation is not None
    assert report.violation.names == ("locks_match_requests",)


def test_explorer_catches_false_out_of_memory(monkeypatch):
    import kvstate.planner.alloc as alloc

    monkeypatch.setattr(alloc, "_ensure_pages",
                        lambda builder, needed, at_head, priority:
                        needed <= len(builder.state.free_pages))
    report = explore(PlannerLevel(SCOPES["planner"], check_model=False), probes=())
    assert report.violation is not None
    assert report.violation.names == ("no_false_oom",)


# 600 examples: the search stops at the first failure (a few dozen examples in the suite's
# order), but which examples come first varies with what ran earlier in the process, and
# after tests/test_log_host_tier.py the lock canary needs more than 200.
SGLANG_SETTINGS = settings(max_examples=600, stateful_step_count=30, deadline=None,
                           derandomize=True, database=None, phases=[Phase.generate],
                           report_multiple_bugs=False)


def test_sglang_machine_catches_partial_fill_off_by_one(monkeypatch):
    import kvstate.planner.alloc as alloc
    import kvstate.sglang.allocator as sglang_allocator
    from tests.test_stateful_sglang_model import SGLangModelMachine

    broken = _off_by_one_extend_slots(alloc.extend_slots)
    monkeypatch.setattr(alloc, "extend_slots", broken)
    monkeypatch.setattr(sglang_allocator, "extend_slots", broken)
    with pytest.raises(Exception):  # noqa: B017 - a rejected event or a failed check
        run_state_machine_as_test(SGLangModelMachine, settings=SGLANG_SETTINGS)


def test_sglang_machine_catches_lock_not_released_on_finish(monkeypatch):
    import kvstate.sglang.radix_cache as radix_cache
    from tests.test_stateful_sglang_model import SGLangModelMachine

    monkeypatch.setattr(radix_cache, "plan_release", _release_keeps_lock(radix_cache.plan_release))
    with pytest.raises(AssertionError):
        run_state_machine_as_test(SGLangModelMachine, settings=SGLANG_SETTINGS)


def test_explorer_catches_wrong_prefix_hit(monkeypatch):
    """A match that compares only lengths, not tokens: a prefix hit on someone else's KV."""
    import kvstate.planner.tree_ops as tree_ops

    monkeypatch.setattr(tree_ops, "common_prefix", lambda a, b: min(len(a), len(b)))
    scope = Scope("canary-planner", "planner", num_pages=4, page_size=1, num_rows=2, vocab=2,
                  max_depth=3, kinds=("admit", "finish"), prompt_lengths=(3,), symmetry=False)
    report = explore(PlannerLevel(scope, check_model=False), probes=())
    assert report.violation is not None
    assert report.violation.names == ("prefix_hits_match_tokens",)


@pytest.mark.parametrize("broken", sorted(EVENT_CANARIES), indirect=True)
def test_parallel_explorer_catches(broken):
    """The multi-process BFS catches every canary too, with a confirmed counterexample."""
    from kvstate.checking.parallel import explore_parallel

    target, _, _, scope = EVENT_CANARIES[broken]
    report = explore_parallel(EventLevel(scope, check_model=False), workers=2, probes=())
    assert report.violation is not None, f"{broken} went unnoticed"
    assert report.violation.names == (target,)
    assert len(report.violation.events()) <= scope.max_depth
