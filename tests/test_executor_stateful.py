"""Stateful check: core request flows drive real buffers; every token reads back its tag.

The machine runs the planner's flows (admission with prefix match, extend,
decode, checkpoint, finish/retract, eviction, and a fork that shares full
pages and copies the partial one) on an ``Engine`` with a ``TorchExecutor``
attached in integrity mode.  After every step the core invariants hold and
every live token of every request, and every tree token, reads back its own
tag through every export.  ``device`` is cpu, and cuda when a GPU exists.
"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvstate import Engine, Geometry, ModelConfig
from kvstate.events import Allocate, Assign, Copy, Lock, ReqAlloc, ReqFree, Share, Unlock
from kvstate.executor import TorchExecutor, enable_integrity
from kvstate.invariants import check
from kvstate.planner.alloc import plan_decode, plan_extend
from kvstate.planner.evict import plan_evict
from kvstate.planner.requests import RequestCursor, plan_checkpoint, plan_release
from kvstate.planner.tree_ops import plan_match
from kvstate.state import ROOT

CONFIG = ModelConfig(num_layers=2, num_kv_heads=1, head_dim=4)
ROWS = 5
TOKENS = st.lists(st.integers(1, 3), min_size=1, max_size=12)


class Live:
    """What a scheduler keeps for one request (test-side, mutable)."""

    def __init__(self, tokens: list[int], cursor: RequestCursor) -> None:
        self.tokens = tokens
        self.prompt_len = len(tokens)
        self.cursor = cursor


class ExecutorMachine(RuleBasedStateMachine):
    device = "cpu"

    @initialize(page_size=st.sampled_from([1, 2, 4]), num_pages=st.integers(6, 14))
    def build(self, page_size: int, num_pages: int) -> None:
        self.engine = Engine(Geometry(num_pages=num_pages, page_size=page_size, num_rows=ROWS,
                                      row_width=64))
        self.executor = TorchExecutor(CONFIG, num_pages, page_size, device=self.device)
        self.executor.attach(self.engine)
        self.monitor = enable_integrity(self.executor)
        self.live: dict[int, Live] = {}

    @property
    def state(self):
        return self.engine.state

    def _free_row(self) -> int | None:
        rows = self.state.free_rows.head(1)
        return rows[0] if rows else None

    # -- flows ---------------------------------------------------------------------
    @precondition(lambda self: len(self.state.free_rows) > 0)
    @rule(prompt=TOKENS)
    def admit(self, prompt: list[int]) -> None:
        row = self._free_row()
        assert row is not None
        self.engine.apply(ReqAlloc((row,)))
        match = self.engine.commit(plan_match(self.state, prompt))
        if match.length:
            self.engine.apply(Assign(row, 0, match.slots))
        if match.last_node != ROOT:
            self.engine.apply(Lock(match.last_node))
        plan = plan_extend(self.state, [(row, len(prompt))], at_head=self.state.page_size > 1)
        if plan is None:  # out of memory: undo the admission
            if match.last_node != ROOT:
                self.engine.apply(Unlock(match.last_node))
            self.engine.apply(ReqFree((row,)))
            return
        self.engine.commit(plan)
        self.live[row] = Live(list(prompt), RequestCursor(row, match.length, match.last_node))

    @precondition(lambda self: self.live)
    @rule(data=st.data(), token=st.integers(1, 3))
    def decode(self, data: st.DataObject, token: int) -> None:
        row = data.draw(st.sampled_from(sorted(self.live)))
        plan = plan_decode(self.state, [row], at_head=self.state.page_size > 1)
        if plan is not None:
            self.engine.commit(plan)
            self.live[row].tokens.append(token)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def checkpoint(self, data: st.DataObject) -> None:
        row = data.draw(st.sampled_from(sorted(self.live)))
        live = self.live[row]
        live.cursor = self.engine.commit(plan_checkpoint(
            self.state, live.cursor, live.tokens, prompt_len=live.prompt_len,
            up_to=len(live.tokens), at_head=self.state.page_size > 1))

    @precondition(lambda self: self.live)
    @rule(data=st.data(), finish=st.booleans())
    def release(self, data: st.DataObject, finish: bool) -> None:
        row = data.draw(st.sampled_from(sorted(self.live)))
        live = self.live.pop(row)
        self.engine.commit(plan_release(
            self.state, live.cursor, live.tokens, prompt_len=live.prompt_len,
            owned=len(live.tokens), checkpoint=finish, at_head=self.state.page_size > 1))

    @rule(tokens=st.integers(1, 16))
    def evict(self, tokens: int) -> None:
        self.engine.commit(plan_evict(self.state, tokens, at_head=self.state.page_size > 1))

    @precondition(lambda self: self.live and len(self.state.free_rows) > 0)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        """A new request shares the parent's full pages and copies its partial page."""
        parent = data.draw(st.sampled_from(sorted(self.live)))
        size = self.state.page_size
        length = self.state.requests[parent].allocated
        full = length // size * size
        partial = length - full
        if partial and not len(self.state.free_pages):
            return
        row = self._free_row()
        assert row is not None
        self.engine.apply(ReqAlloc((row,)))
        slots = self.state.slots_of(parent)
        if full:
            self.engine.apply(Share(row, 0, tuple(slots[:full])))
        if partial:
            fresh = self.state.free_pages.head(1)[0]
            self.engine.apply(Allocate((fresh,)))
            self.engine.apply(Copy((slots[full] // size,), (fresh,)))
            self.engine.apply(Assign(row, full, tuple(fresh * size + k for k in range(partial))))
        tokens = list(self.live[parent].tokens[:length])
        fork = Live(tokens, RequestCursor(row))
        fork.prompt_len = self.live[parent].prompt_len
        self.live[row] = fork

    # -- checks ------------------------------------------------------------------------
    @invariant()
    def core_invariants_hold(self) -> None:
        assert check(self.state) == []

    @invariant()
    def every_token_reads_its_tag(self) -> None:
        report = self.monitor.verify()
        assert report.ok, str(report)


class CudaExecutorMachine(ExecutorMachine):
    device = "cuda"


TestExecutorMachineCpu = ExecutorMachine.TestCase
TestExecutorMachineCuda = pytest.mark.cuda(CudaExecutorMachine.TestCase)
