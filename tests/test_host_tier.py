"""The host tier: offload/load events, their rules, write policies and integrity.

The host tier is part of ``State`` (``initial_state(geometry, host_pages=N)``);
the planner's host functions emit into a builder (``PlanBuilder`` for pure
use, an engine batch for the executor).  The executor follows an ``Engine``
with a host tier and its integrity monitor checks every device and host
token after each step of the stateful test.
"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvstate import Engine, Geometry, InvalidEvent, ModelConfig, apply
from kvstate.events import (
    Allocate,
    Assign,
    Evict,
    HostFree,
    Insert,
    Load,
    Lock,
    Offload,
    ReqAlloc,
    ReqFree,
    Reset,
    Unlock,
    decode_event,
    encode_event,
)
from kvstate.executor import HostPool, TorchExecutor, enable_integrity
from kvstate.invariants import check
from kvstate.planner.builder import PlanBuilder
from kvstate.planner.host import (
    WRITE_BACK,
    WRITE_THROUGH,
    plan_checkpoint_tiered,
    plan_evict_tiered,
    plan_extend_tiered,
    plan_host_evict,
    plan_insert_tiered,
    plan_match_tiered,
)
from kvstate.planner.requests import RequestCursor, plan_release
from kvstate.state import ROOT, State, initial_state

CONFIG = ModelConfig(num_layers=2, num_kv_heads=1, head_dim=4)
GEOMETRY = Geometry(num_pages=6, page_size=2, num_rows=4, row_width=64)


def fold(state: State, *events) -> State:
    for event in events:
        state = apply(state, event)
    return state


def planned(state: State, plan, *args, **kwargs) -> tuple[State, list, object]:
    """Run a planner function on ``state``: (state after, its events, its result)."""
    b = PlanBuilder(state)
    result = plan(b, *args, **kwargs)
    return b.state, b.events, result


def with_tree(policy=WRITE_THROUGH, host_pages=8):
    """A tree holding [1..8] (P=2) as node 1, inserted by a DETACHED allocation."""
    state = fold(initial_state(GEOMETRY, host_pages=host_pages), Allocate((1, 2, 3, 4)))
    state, _, _ = planned(state, plan_insert_tiered, [1, 2, 3, 4, 5, 6, 7, 8],
                          [2, 3, 4, 5, 6, 7, 8, 9], 0, policy=policy, at_head=True)
    return state


def match(state: State, key, policy) -> State:
    return planned(state, plan_match_tiered, key, policy=policy, at_head=True)[0]


# -- events and the reducer ------------------------------------------------------------
def test_host_events_roundtrip_and_refuse_plain_states():
    for event in (Offload(3, (0, 1)), Load(3, (2, 4), 7), HostFree((3, 5), True)):
        assert decode_event(encode_event(event)) == event
    with pytest.raises(InvalidEvent, match="needs a host tier"):
        apply(initial_state(Geometry(num_pages=4)), Offload(1, (0,)))
    assert Engine(GEOMETRY, host_pages=3).view.host.num_pages == 3


def test_write_through_backs_up_on_insert_and_evict_keeps_the_key():
    state = with_tree(WRITE_THROUGH)
    assert dict(state.host.backup) == {1: (0, 1, 2, 3)}
    state = fold(state, Evict((1,), True))
    assert 1 not in state.nodes
    assert state.host.evicted[1].key == (1, 2, 3, 4, 5, 6, 7, 8)
    assert len(state.free_pages) == 6
    assert check(state) == []


def test_write_back_does_not_back_up_on_insert():
    state = with_tree(WRITE_BACK)
    assert dict(state.host.backup) == {}
    after, events, evicted = planned(state, plan_evict_tiered, 2, policy=WRITE_BACK, at_head=True)
    assert evicted == 8
    assert [type(e).__name__ for e in events] == ["Offload", "Evict"]
    assert after.host.evicted[1].parent == ROOT


def test_host_only_hit_is_loaded_back():
    state = fold(with_tree(WRITE_THROUGH), Evict((1,), True))
    after, events, result = planned(state, plan_match_tiered, [1, 2, 3, 4, 9],
                                    policy=WRITE_THROUGH, at_head=True)
    kinds = [type(e).__name__ for e in events]
    assert "Load" in kinds and "Split" in kinds
    assert result.length == 4
    assert len(after.host.evicted) == 0
    assert check(after) == []
    # the split carried the backup along: top half and bottom half each own their host pages
    assert sorted(after.host.backup.values()) == [(0, 1), (2, 3)]


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
    split = match(state, [1, 2, 3, 4], WRITE_BACK)
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
    assert loaded.nodes[1].pages == (1, 2, 3, 4) and loaded.evictable_size == 8
    with pytest.raises(InvalidEvent, match="has no host copy"):
        fold(loaded, HostFree((1,)), HostFree((1,)))
    dropped = fold(state, HostFree((1,)))
    assert 1 not in dropped.host.evicted and len(dropped.host.free_pages) == 8
    assert check(dropped) == []


def test_insert_over_a_host_only_node_is_refused():
    state = fold(with_tree(WRITE_THROUGH), Evict((1,), True))
    state = fold(state, Allocate((1,)))
    with pytest.raises(InvalidEvent, match="load it back first"):
        fold(state, Insert(ROOT, (1, 2), (2, 3), 2, 10, 0))


def test_evicting_an_unbacked_parent_of_host_only_nodes_is_refused():
    state = with_tree(WRITE_THROUGH)
    # forge a host-only child under a device node that has no copy
    split = match(state, [1, 2, 3, 4], WRITE_THROUGH)
    assert check(split) == []
    dropped = fold(split, Evict((1,), True))
    assert 1 in dropped.host.evicted
    with pytest.raises(InvalidEvent, match="still has host-only children"):
        fold(dropped, HostFree((2,)))


def test_reset_tree_drops_the_host_tier():
    state = fold(with_tree(WRITE_THROUGH), Evict((1,), True), Reset("tree"))
    assert len(state.host.free_pages) == 8 and not state.host.backup


def test_host_evict_drops_lru_host_only_leaves():
    state = fold(with_tree(WRITE_THROUGH, host_pages=4), Evict((1,), True))
    after, events, _ = planned(state, plan_host_evict, 4)
    assert [type(e).__name__ for e in events] == ["HostFree"]
    assert len(after.host.free_pages) == 4


# -- executor integration --------------------------------------------------------------
def tiered_executor(host_pages=8, geometry=GEOMETRY, device="cpu", poison_freed=False):
    """An engine with a host tier, an executor following it, and its integrity monitor."""
    engine = Engine(geometry, host_pages=host_pages)
    executor = TorchExecutor(CONFIG, geometry.num_pages, geometry.page_size, device=device,
                             poison_freed=poison_freed)
    executor.enable_host(HostPool(executor, host_pages))
    executor.attach(engine)
    return engine, executor, enable_integrity(executor)


def _cached_then_evicted(engine, policy):
    """Request 1 computes [1..8], caches it, finishes; everything is evicted (to host)."""
    tokens = list(range(1, 9))
    engine.apply(ReqAlloc((1,)))
    with engine.batch() as b:
        plan_extend_tiered(b, [(1, 8)], policy=policy, at_head=True)
    with engine.batch() as b:
        cursor = plan_checkpoint_tiered(b, RequestCursor(1), tokens, prompt_len=8, up_to=8,
                                        policy=policy, at_head=True)
    with engine.batch() as b:
        plan_release(b, cursor, tokens, prompt_len=8, owned=8, checkpoint=False, at_head=True)
        plan_evict_tiered(b, 100, policy=policy, at_head=True)
    with engine.batch() as b:
        plan_match_tiered(b, tokens, policy=policy, at_head=True)
    return engine.state


@pytest.mark.parametrize("policy", [WRITE_THROUGH, WRITE_BACK])
def test_integrity_across_offload_evict_and_load(policy):
    engine, executor, monitor = tiered_executor()
    state = _cached_then_evicted(engine, policy)
    assert 1 in state.nodes and dict(state.host.backup) == {1: (0, 1, 2, 3)}
    report = monitor.verify()
    assert report.ok, str(report)
    # 8 tree tokens on the device and 8 on the host, 2 layers each
    assert report.tokens_checked == 2 * 8 * 2


def test_integrity_catches_a_load_that_moved_no_bytes():
    engine, executor, monitor = tiered_executor(poison_freed=True)  # freed pages read NaN
    executor.host_pool.load_slots = lambda host_slots, device_slots: None  # a broken DMA
    _cached_then_evicted(engine, WRITE_THROUGH)
    assert "a tree token does not read back its tag" in str(monitor.verify())


# -- stateful: tiered flows with integrity after every step ---------------------------------
TOKENS = st.lists(st.integers(1, 3), min_size=1, max_size=10)


class HostTierMachine(RuleBasedStateMachine):
    """Planner flows on a host-tier engine; the executor's integrity check after every step."""

    device = "cpu"

    @initialize(page_size=st.sampled_from([1, 2]), num_pages=st.integers(5, 10),
                host_pages=st.integers(2, 12), policy=st.sampled_from([WRITE_THROUGH, WRITE_BACK]))
    def build(self, page_size, num_pages, host_pages, policy):
        self.policy = policy
        geometry = Geometry(num_pages=num_pages, page_size=page_size, num_rows=4, row_width=64)
        self.engine, self.executor, self.monitor = tiered_executor(
            host_pages, geometry, self.device, poison_freed=True)
        self.live = {}

    @property
    def view(self):
        return self.engine.view

    @precondition(lambda self: len(self.view.free_rows) > 0)
    @rule(prompt=TOKENS)
    def admit(self, prompt):
        row = self.view.free_rows.head(1)[0]
        self.engine.apply(ReqAlloc((row,)))
        with self.engine.batch() as b:
            matched = plan_match_tiered(b, prompt, policy=self.policy, at_head=True)
        if matched.length:
            self.engine.apply(Assign(row, 0, matched.slots))
        if matched.last_node != ROOT:
            self.engine.apply(Lock(matched.last_node))
        with self.engine.batch() as b:
            slots = plan_extend_tiered(b, [(row, len(prompt))], policy=self.policy, at_head=True)
        if slots is None:
            if matched.last_node != ROOT:
                self.engine.apply(Unlock(matched.last_node))
            self.engine.apply(ReqFree((row,)))
            return
        self.live[row] = [list(prompt), len(prompt),
                          RequestCursor(row, matched.length, matched.last_node)]

    @precondition(lambda self: self.live)
    @rule(data=st.data(), token=st.integers(1, 3))
    def decode(self, data, token):
        row = data.draw(st.sampled_from(sorted(self.live)))
        tokens = self.live[row][0]
        with self.engine.batch() as b:
            slots = plan_extend_tiered(b, [(row, len(tokens) + 1)], policy=self.policy,
                                       at_head=True)
        if slots is not None:
            tokens.append(token)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), finish=st.booleans())
    def release(self, data, finish):
        row = data.draw(st.sampled_from(sorted(self.live)))
        tokens, prompt_len, cursor = self.live.pop(row)
        if finish:
            with self.engine.batch() as b:
                cursor = plan_checkpoint_tiered(b, cursor, tokens, prompt_len=prompt_len,
                                                up_to=len(tokens), policy=self.policy,
                                                at_head=True)
        with self.engine.batch() as b:
            plan_release(b, cursor, tokens, prompt_len=prompt_len, owned=len(tokens),
                         checkpoint=False, at_head=True)

    @rule(tokens=st.integers(1, 12))
    def evict(self, tokens):
        with self.engine.batch() as b:
            plan_evict_tiered(b, tokens, policy=self.policy, at_head=True)

    @rule(pages=st.integers(1, 12))
    def host_evict(self, pages):
        with self.engine.batch() as b:
            plan_host_evict(b, pages)

    @invariant()
    def consistent(self):
        assert check(self.view) == []
        report = self.monitor.verify()
        assert report.ok, str(report)


class CudaHostTierMachine(HostTierMachine):
    device = "cuda"


TestHostTierMachineCpu = HostTierMachine.TestCase
TestHostTierMachineCuda = pytest.mark.cuda(CudaHostTierMachine.TestCase)
