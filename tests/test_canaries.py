"""Canaries: every property is live, on both backends.

For each ALWAYS and TRANSITIONS property in ``specs.invariants`` (which
include every named invariant of ``kvstate.invariants``, the host tier's
too) there is a broken variant of one shared rule (``tests/canary_rules.py``),
installed in ``kvstate.rules.RULES`` so both backends run it.  The explorer
(persistent backend) must catch it in a tiny scope *with only that property
registered and the spec model off* (so the catch is that property's own),
and so must the hypothesis state machine (persistent and live backends side
by side) and the multi-process explorer.  Planner-level properties have
canaries that break the planner instead.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

import specs.invariants as spec
import tests.canary_rules as broken_rules
from kvstate import events as ev
from kvstate.checking import SCOPES, EventLevel, PlannerLevel, explore
from kvstate.checking.scopes import Scope
from kvstate.rules import RULES
from kvstate.testing.machine import SpecMachine
from kvstate.testing.machines import HostSpecMachine

CANARY_SCOPE = Scope("canary", "event", num_pages=2, page_size=1, num_rows=2, vocab=2,
                     max_depth=5, max_key_pages=2)
PAGED_SCOPE = Scope("canary-paged", "event", num_pages=2, page_size=2, num_rows=2, vocab=2,
                    max_depth=5, max_key_pages=2)
HOST_SCOPE = Scope("canary-host", "event", num_pages=2, page_size=1, num_rows=1, vocab=2,
                   max_depth=5, max_key_pages=2, host_pages=2, symmetry=False,
                   kinds=("allocate", "insert", "split", "evict", "offload", "load", "host_free"))
MACHINE_SETTINGS = settings(max_examples=1000, stateful_step_count=30, deadline=None,
                            derandomize=True, database=None, phases=[Phase.generate],
                            report_multiple_bugs=False)

B = broken_rules
# name: (property, event type, factory(real rule) -> broken rule, scope)
EVENT_CANARIES: dict[str, tuple[str, type[ev.Event], Callable, Scope]] = {
    "free-keeps-holder": ("conservation", ev.Free, B.free_keeps_holder, CANARY_SCOPE),
    "free-appends-page-twice": ("conservation", ev.Evict, B.evict_frees_shared_pages, CANARY_SCOPE),
    "stale-prefix-hit-after-eviction": ("conservation", ev.Evict, B.evict_leaves_node,
                                        CANARY_SCOPE),
    "refcount-not-decremented": ("refcounts", ev.Truncate, B.truncate_keeps_hold, CANARY_SCOPE),
    "row-handed-out-twice": ("reserved_ids", ev.ReqAlloc, B.req_alloc_keeps_row_free, CANARY_SCOPE),
    "lock-skips-size-accounting": ("tree_sizes", ev.Lock, B.lock_skips_sizes, CANARY_SCOPE),
    "lock-keeps-leaf-index": ("leaf_index", ev.Lock, B.lock_keeps_leaf_index, CANARY_SCOPE),
    "split-drops-lock-ref": ("lock_monotonic", ev.Split, B.split_drops_lock_ref, CANARY_SCOPE),
    "insert-skips-child-index": ("node_shape", ev.Insert, B.insert_skips_child_index, CANARY_SCOPE),
    "allocate-overcounts": ("request_lengths", ev.Allocate, B.allocate_overcounts, CANARY_SCOPE),
    "evict-mapped-page (F1)": ("table_refs_live", ev.Evict, B.evict_ignores_mapping, CANARY_SCOPE),
    "touch-keeps-clock": ("clock", ev.Touch, B.touch_keeps_clock, CANARY_SCOPE),
    "share-page-twice (F5)": ("table_injective", ev.Share, B.share_allows_mapped_page,
                              CANARY_SCOPE),
    "touch-stamps-unnamed-nodes": ("frame", ev.Touch, B.touch_stamps_everything, CANARY_SCOPE),
    "evict-node-with-locked-child": ("evict_locked", ev.Evict, B.evict_ignores_locks, CANARY_SCOPE),
    "free-changes-other-tables": ("free_isolation", ev.ReqFree, B.req_free_truncates_others,
                                  CANARY_SCOPE),
    "share-skips-refcount": ("refcount_delta", ev.Share, B.share_skips_holder, PAGED_SCOPE),
    "touch-moves-clock-back": ("clock_monotone", ev.Touch, B.touch_moves_clock_back, CANARY_SCOPE),
    "offload-leaves-host-pages-free": ("host_owned_once", ev.Offload, B.offload_leaves_pages_free,
                                       HOST_SCOPE),
    "split-keeps-backup-below": ("host_root_closed", ev.Split, B.split_keeps_backup_below,
                                 HOST_SCOPE),
    "evict-forgets-host-key": ("host_only_keeps_key", ev.Evict, B.evict_forgets_key, HOST_SCOPE),
}


def test_every_property_has_a_canary():
    covered = {target for target, *_ in EVENT_CANARIES.values()}
    assert covered == set(spec.ALWAYS) | set(spec.TRANSITIONS)


@pytest.fixture
def broken(request, monkeypatch):
    """Break one shared rule (both backends); register only the target property."""
    target, event_type, factory, _ = EVENT_CANARIES[request.param]
    monkeypatch.setitem(RULES, event_type, factory(RULES[event_type]))
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


class _HostCanaryMachine(HostSpecMachine):
    check_model = False


@pytest.mark.parametrize("broken", sorted(EVENT_CANARIES), indirect=True)
def test_state_machine_catches(broken, tmp_path):
    """The machine runs both backends; the broken rule is caught as its own property."""
    target, _, _, scope = EVENT_CANARIES[broken]
    machine = _HostCanaryMachine if scope.host_pages else _CanaryMachine
    machine.log_dir = str(tmp_path)
    with pytest.raises(AssertionError, match=rf"\[{target}\]"):
        run_state_machine_as_test(machine, settings=MACHINE_SETTINGS)


@pytest.mark.parametrize("broken", sorted(EVENT_CANARIES), indirect=True)
def test_parallel_explorer_catches(broken):
    """The multi-process BFS catches every canary too, with a confirmed counterexample."""
    from kvstate.checking.parallel import explore_parallel

    target, _, _, scope = EVENT_CANARIES[broken]
    report = explore_parallel(EventLevel(scope, check_model=False), workers=2, probes=())
    assert report.violation is not None, f"{broken} went unnoticed"
    assert report.violation.names == (target,)
    assert len(report.violation.events()) <= scope.max_depth


# -- planner-level canaries ---------------------------------------------------------------
def off_by_one_extend_slots(real):
    """The old partial page is filled from ``last_loc + 2``: an off-by-one in part 1."""
    def broken(page_size, entries, free_pages):
        out = real(page_size, entries, free_pages)
        for (prefix_len, _seq_len, last_loc), slots in zip(entries, out, strict=True):
            if prefix_len % page_size and slots:
                slots[0] = last_loc + 2
        return out
    return broken


class _DropUnlocks:
    """A builder that forwards every event but ``Unlock``."""

    def __init__(self, builder):
        self.builder = builder

    @property
    def state(self):
        return self.builder.state

    def emit(self, event):
        if not isinstance(event, ev.Unlock):
            self.builder.emit(event)


def release_keeps_lock(real):
    """A lock not released on finish: the release's Unlock is dropped."""
    def broken(b, cursor, *args, **kwargs):
        return real(_DropUnlocks(b), cursor, *args, **kwargs)
    return broken


def test_explorer_catches_partial_fill_off_by_one(monkeypatch):
    import kvstate.planner.alloc as alloc

    monkeypatch.setattr(alloc, "extend_slots", off_by_one_extend_slots(alloc.extend_slots))
    report = explore(PlannerLevel(SCOPES["planner-paged"], check_model=False), max_depth=3,
                     probes=())
    assert report.violation is not None
    assert report.violation.names == ("planner_valid",)


def test_explorer_catches_lock_not_released_on_finish(monkeypatch):
    import kvstate.checking.planner_level as pl

    monkeypatch.setattr(pl, "plan_release", release_keeps_lock(pl.plan_release))
    report = explore(PlannerLevel(SCOPES["planner"], check_model=False), max_depth=3, probes=())
    assert report.violation is not None
    assert report.violation.names == ("locks_match_requests",)


def test_explorer_catches_false_out_of_memory(monkeypatch):
    import kvstate.planner.alloc as alloc

    monkeypatch.setattr(alloc, "_ensure_pages",
                        lambda b, needed, at_head, select: needed <= len(b.state.free_pages))
    report = explore(PlannerLevel(SCOPES["planner"], check_model=False), probes=())
    assert report.violation is not None
    assert report.violation.names == ("no_false_oom",)


# The search stops at the first failure, but which examples come first varies with what
# ran earlier in the process, so the SGLang canaries get a generous budget.
SGLANG_SETTINGS = settings(max_examples=600, stateful_step_count=30, deadline=None,
                           derandomize=True, database=None, phases=[Phase.generate],
                           report_multiple_bugs=False)


def test_sglang_machine_catches_partial_fill_off_by_one(monkeypatch):
    import kvstate.planner.alloc as alloc
    import kvstate.sglang.allocator as sglang_allocator
    from tests.test_stateful_sglang_model import SGLangModelMachine

    broken = off_by_one_extend_slots(alloc.extend_slots)
    monkeypatch.setattr(alloc, "extend_slots", broken)
    monkeypatch.setattr(sglang_allocator, "extend_slots", broken)
    with pytest.raises(Exception):  # noqa: B017 - a rejected event or a failed check
        run_state_machine_as_test(SGLangModelMachine, settings=SGLANG_SETTINGS)


def test_sglang_machine_catches_lock_not_released_on_finish(monkeypatch):
    import kvstate.sglang.flows as flows
    from tests.test_stateful_sglang_model import SGLangModelMachine

    monkeypatch.setattr(flows, "plan_release", release_keeps_lock(flows.plan_release))
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
