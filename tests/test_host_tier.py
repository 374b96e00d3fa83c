"""The host tier: offload/load events, the tiered reducer, write policies and integrity."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvstate import Geometry, InvalidEvent, ModelConfig
from kvstate.events import (
    Allocate,
    Assign,
    Evict,
    Insert,
    Lock,
    ReqAlloc,
    ReqFree,
    Reset,
    Unlock,
    decode_event,
    encode_event,
)
from kvstate.events_host import HostFree, Load, Offload
from kvstate.executor import HostPool, TorchExecutor, enable_integrity
from kvstate.invariants import check
from kvstate.invariants_host import check_host
from kvstate.planner.host import (
    WRITE_BACK,
    WRITE_THROUGH,
    TieredBuilder,
    plan_checkpoint_tiered,
    plan_evict_tiered,
    plan_extend_tiered,
    plan_host_evict,
    plan_insert_tiered,
    plan_match_tiered,
)
from kvstate.planner.requests import RequestCursor, plan_release
from kvstate.reducer import apply
from kvstate.reducer.host import apply_tiered
from kvstate.state import ROOT, initial_state
from kvstate.state_host import TieredState, tiered

CONFIG = ModelConfig(num_layers=2, num_kv_heads=1, head_dim=4)


def fold(state: TieredState, *events) -> TieredState:
    for event in events:
        state = apply_tiered(state, event)
    return state


def with_tree(policy=WRITE_THROUGH, host_pages=8):
    """A tree holding [1..8] (P=2) as node 1, inserted by a DETACHED allocation."""
    state = tiered(initial_state(Geometry(num_pages=6, page_size=2, num_rows=4, row_width=64)),
                   host_pages)
    state = fold(state, Allocate((1, 2, 3, 4)))
    plan = plan_insert_tiered(state, [1, 2, 3, 4, 5, 6, 7, 8], [2, 3, 4, 5, 6, 7, 8, 9], 0,
                              policy=policy, at_head=True)
    return plan.state


# -- events and the reducer ------------------------------------------------------------
def test_host_events_roundtrip_and_refuse_plain_states():
    for event in (Offload(3, (0, 1)), Load(3, (2, 4), 7), HostFree((3, 5), True)):
        assert decode_event(encode_event(event)) == event
    with pytest.raises(InvalidEvent, match="needs a host tier"):
        apply(initial_state(Geometry(num_pages=4)), Offload(1, (0,)))


def test_write_through_backs_up_on_insert_and_evict_keeps_the_key():
    state = with_tree(WRITE_THROUGH)
    assert dict(state.host.backup) == {1: (0, 1, 2, 3)}
    state = fold(state, Evict((1,), True))
    assert 1 not in state.core.nodes
    assert state.host.evicted[1].key == (1, 2, 3, 4, 5, 6, 7, 8)
    assert len(state.core.free_pages) == 6
    assert check_host(state) == [] and check(state.core) == []


def test_write_back_does_not_back_up_on_insert():
    state = with_tree(WRITE_BACK)
    assert dict(state.host.backup) == {}
    builder = TieredBuilder(state)
    assert plan_evict_tiered(builder, 2, policy=WRITE_BACK, at_head=True) == 8
    assert [type(e).__name__ for e in builder.events] == ["Offload", "Evict"]
    assert builder.state.host.evicted[1].parent == ROOT


def test_host_only_hit_is_loaded_back():
    state = fold(with_tree(WRITE_THROUGH), Evict((1,), True))
    plan = plan_match_tiered(state, [1, 2, 3, 4, 9], policy=WRITE_THROUGH, at_head=True)
    kinds = [type(e).__name__ for e in plan.events]
    assert "Load" in kinds and "Split" in kinds
    assert plan.result.length == 4
    assert plan.state.host.evicted == type(plan.state.host.evicted)()
    assert check_host(plan.state) == [] and check(plan.state.core) == []
    # the split carried the backup along: top half and bottom half each own their host pages
    assert sorted(plan.state.host.backup.values()) == [(0, 1), (2, 3)]


def test_offload_preconditions():
    state = with_tree(WRITE_BACK)
    with pytest.raises(InvalidEvent, match="already backed up"):
        fold(state, Offload(1, (0, 1, 2, 3)), Offload(1, (4, 5, 6, 7)))
    with pytest.raises(InvalidEvent, match="has 4 pages"):
        fold(state, Offload(1, (0,)))
    with pytest.raises(InvalidEvent, match="outside 0..7"):
        fold(state, Offload(1, (0, 1, 2, 8)))
    with pytest.raises(InvalidEvent, match="not a device tree node"):
        fold(state, Offload(9, (0,)))
    split = fold(state, *plan_match_tiered(state, [1, 2, 3, 4], policy=WRITE_BACK,
                                           at_head=True).events)
    child = 1  # the split keeps the bottom half under the old id; its parent is not backed up
    with pytest.raises(InvalidEvent, match="root-closed"):
        fold(split, Offload(child, (0, 1)))


def test_host_page_owned_once():
    state = fold(with_tree(WRITE_BACK), Offload(1, (0, 1, 2, 3)))
    state = fold(state, Allocate((5,)), Insert(1, (9, 9), (10, 11), 2, 10, 0))
    with pytest.raises(InvalidEvent, match="owned by node 1"):
        fold(state, Offload(2, (3,)))


def test_load_and_host_free_preconditions():
    state = fold(with_tree(WRITE_THROUGH), Evict((1,), True))
    with pytest.raises(InvalidEvent, match="not a host-only node"):
        fold(state, Load(7, (1, 2, 3, 4), 9))
    with pytest.raises(InvalidEvent, match="needs 4 pages"):
        fold(state, Load(1, (1,), 9))
    with pytest.raises(InvalidEvent, match="before the clock"):
        fold(state, Load(1, (1, 2, 3, 4), 0))
    loaded = fold(state, Load(1, (1, 2, 3, 4), 9))
    assert loaded.core.nodes[1].pages == (1, 2, 3, 4) and loaded.core.evictable_size == 8
    with pytest.raises(InvalidEvent, match="has no host copy"):
        fold(loaded, HostFree((1,)), HostFree((1,)))
    dropped = fold(state, HostFree((1,)))
    assert 1 not in dropped.host.evicted and len(dropped.host.free_pages) == 8
    assert check_host(dropped) == []


def test_insert_over_a_host_only_node_is_refused():
    state = fold(with_tree(WRITE_THROUGH), Evict((1,), True))
    state = fold(state, Allocate((1,)))
    with pytest.raises(InvalidEvent, match="load it back first"):
        fold(state, Insert(ROOT, (1, 2), (2, 3), 2, 10, 0))


def test_evicting_an_unbacked_parent_of_host_only_nodes_is_refused():
    state = with_tree(WRITE_THROUGH)
    # forge a host-only child under a device node that has no copy
    split = fold(state, *plan_match_tiered(state, [1, 2, 3, 4], policy=WRITE_THROUGH,
                                           at_head=True).events)
    assert check_host(split) == []
    dropped = fold(split, Evict((1,), True))
    assert 1 in dropped.host.evicted
    with pytest.raises(InvalidEvent, match="still has host-only children"):
        fold(dropped, HostFree((2,)))


def test_reset_tree_drops_the_host_tier():
    state = fold(with_tree(WRITE_THROUGH), Evict((1,), True), Reset("tree"))
    assert len(state.host.free_pages) == 8 and not state.host.backup


def test_host_evict_drops_lru_host_only_leaves():
    state = fold(with_tree(WRITE_THROUGH, host_pages=4), Evict((1,), True))
    builder = TieredBuilder(state)
    plan_host_evict(builder, 4)
    assert [type(e).__name__ for e in builder.events] == ["HostFree"]
    assert len(builder.state.host.free_pages) == 4


# -- executor integration --------------------------------------------------------------
def tiered_executor(state: TieredState, device="cpu", poison_freed=False):
    geometry = state.core.geometry
    executor = TorchExecutor(CONFIG, geometry.num_pages, geometry.page_size, device=device,
                             poison_freed=poison_freed)
    executor.reset_state(state.core)
    executor.enable_host(HostPool(executor, state.host.num_pages), state.host)
    return executor, enable_integrity(executor)


def _cached_then_evicted(executor, policy):
    """Request 1 computes [1..8], caches it, finishes; everything is evicted (to host)."""
    state = executor.tiered_state
    tokens = list(range(1, 9))

    def run(events, after):
        for event in events:
            executor.apply(event)
        return after

    state = run([ReqAlloc((1,))], fold(state, ReqAlloc((1,))))
    plan = plan_extend_tiered(state, [(1, 8)], policy=policy, at_head=True)
    state = run(plan.events, plan.state)
    plan = plan_checkpoint_tiered(state, RequestCursor(1), tokens, prompt_len=8, up_to=8,
                                  policy=policy, at_head=True)
    state = run(plan.events, plan.state)
    builder = TieredBuilder(state)
    builder.adopt(plan_release(state.core, plan.result, tokens, prompt_len=8, owned=8,
                               checkpoint=False, at_head=True))
    plan_evict_tiered(builder, 100, policy=policy, at_head=True)
    state = run(builder.events, builder.state)
    plan = plan_match_tiered(state, tokens, policy=policy, at_head=True)
    return run(plan.events, plan.state)


@pytest.mark.parametrize("policy", [WRITE_THROUGH, WRITE_BACK])
def test_integrity_across_offload_evict_and_load(policy):
    base = tiered(initial_state(Geometry(num_pages=6, page_size=2, num_rows=4, row_width=64)), 8)
    executor, monitor = tiered_executor(base)
    state = _cached_then_evicted(executor, policy)
    assert executor.tiered_state == state
    assert 1 in state.core.nodes and dict(state.host.backup) == {1: (0, 1, 2, 3)}
    report = monitor.verify()
    assert report.ok, str(report)
    # 8 tree tokens on the device and 8 on the host, 2 layers each
    assert report.tokens_checked == 2 * 8 * 2


def test_integrity_catches_a_load_that_moved_no_bytes():
    base = tiered(initial_state(Geometry(num_pages=6, page_size=2, num_rows=4, row_width=64)), 8)
    executor, monitor = tiered_executor(base, poison_freed=True)  # freed pages read NaN
    executor.host_pool.load_slots = lambda host_slots, device_slots: None  # a broken DMA
    _cached_then_evicted(executor, WRITE_THROUGH)
    assert "a tree token does not read back its tag" in str(monitor.verify())


# -- stateful: tiered flows with integrity after every step ---------------------------------
TOKENS = st.lists(st.integers(1, 3), min_size=1, max_size=10)


class HostTierMachine(RuleBasedStateMachine):
    device = "cpu"

    @initialize(page_size=st.sampled_from([1, 2]), num_pages=st.integers(5, 10),
                host_pages=st.integers(2, 12), policy=st.sampled_from([WRITE_THROUGH, WRITE_BACK]))
    def build(self, page_size, num_pages, host_pages, policy):
        self.policy = policy
        self.state = tiered(initial_state(Geometry(num_pages=num_pages, page_size=page_size,
                                                   num_rows=4, row_width=64)), host_pages)
        self.executor, self.monitor = tiered_executor(self.state, self.device, poison_freed=True)
        self.live = {}

    def _run(self, events, state):
        for event in events:
            self.executor.apply(event)
        self.state = state

    def _one(self, event):
        self._run([event], apply_tiered(self.state, event))

    @precondition(lambda self: len(self.state.core.free_rows) > 0)
    @rule(prompt=TOKENS)
    def admit(self, prompt):
        row = self.state.core.free_rows.head(1)[0]
        self._one(ReqAlloc((row,)))
        plan = plan_match_tiered(self.state, prompt, policy=self.policy, at_head=True)
        self._run(plan.events, plan.state)
        match = plan.result
        if match.length:
            self._one(Assign(row, 0, match.slots))
        if match.last_node != ROOT:
            self._one(Lock(match.last_node))
        plan = plan_extend_tiered(self.state, [(row, len(prompt))], policy=self.policy, at_head=True)
        if plan.result is None:
            if match.last_node != ROOT:
                self._one(Unlock(match.last_node))
            self._one(ReqFree((row,)))
            return
        self._run(plan.events, plan.state)
        self.live[row] = [list(prompt), len(prompt), RequestCursor(row, match.length, match.last_node)]

    @precondition(lambda self: self.live)
    @rule(data=st.data(), token=st.integers(1, 3))
    def decode(self, data, token):
        row = data.draw(st.sampled_from(sorted(self.live)))
        tokens = self.live[row][0]
        plan = plan_extend_tiered(self.state, [(row, len(tokens) + 1)], policy=self.policy, at_head=True)
        if plan.result is not None:
            self._run(plan.events, plan.state)
            tokens.append(token)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), finish=st.booleans())
    def release(self, data, finish):
        row = data.draw(st.sampled_from(sorted(self.live)))
        tokens, prompt_len, cursor = self.live.pop(row)
        if finish:
            plan = plan_checkpoint_tiered(self.state, cursor, tokens, prompt_len=prompt_len,
                                          up_to=len(tokens), policy=self.policy, at_head=True)
            self._run(plan.events, plan.state)
            cursor = plan.result
        builder = TieredBuilder(self.state)
        builder.adopt(plan_release(self.state.core, cursor, tokens, prompt_len=prompt_len,
                                   owned=len(tokens), checkpoint=False, at_head=True))
        self._run(builder.events, builder.state)

    @rule(tokens=st.integers(1, 12))
    def evict(self, tokens):
        builder = TieredBuilder(self.state)
        plan_evict_tiered(builder, tokens, policy=self.policy, at_head=True)
        self._run(builder.events, builder.state)

    @rule(pages=st.integers(1, 12))
    def host_evict(self, pages):
        builder = TieredBuilder(self.state)
        plan_host_evict(builder, pages)
        self._run(builder.events, builder.state)

    @invariant()
    def consistent(self):
        assert self.executor.tiered_state == self.state
        assert check(self.state.core) == []
        assert check_host(self.state) == []
        report = self.monitor.verify()
        assert report.ok, str(report)


class CudaHostTierMachine(HostTierMachine):
    device = "cuda"


TestHostTierMachineCpu = HostTierMachine.TestCase
TestHostTierMachineCuda = pytest.mark.cuda(CudaHostTierMachine.TestCase)
