"""Stateful check: core request flows drive real buffers; every token reads back its tag.

The machine runs the planner's flows (admission with prefix match, extend,
decode, checkpoint, finish/retract, eviction, and a fork that shares full
pages and copies the partial one, and SGLang's free of a row's last page under
the row followed by a rewrite or a truncation) on an ``Engine`` with a ``TorchExecutor``
attached in integrity mode.  After every step the core invariants hold and
every live token of every request, and every tree token, reads back its own
tag through every export.  ``device`` is cpu, and cuda when a GPU exists.
"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvstate import Engine, Geometry, ModelConfig
from kvstate.events import (
    Allocate,
    Assign,
    Copy,
    FreeMapped,
    Lock,
    ReqAlloc,
    ReqFree,
    Share,
    Truncate,
    Unlock,
)
from kvstate.executor import TorchExecutor, UseAfterFree, enable_integrity, sglang_req_to_token
from kvstate.invariants import check
from kvstate.planner.alloc import plan_decode, plan_extend
from kvstate.planner.evict import plan_evict
from kvstate.planner.requests import RequestCursor, plan_checkpoint, plan_release
from kvstate.planner.tree_ops import plan_match
from kvstate.state import ROOT

CONFIG = ModelConfig(num_layers=2, num_kv_heads=1, head_dim=4)


def decide(engine, planner, *args, **kwargs):
    with engine.batch() as batch:
        return planner(batch, *args, **kwargs)
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
        self.executor = TorchExecutor(CONFIG, num_pages, page_size, device=self.device,
                                      poison_freed=True)
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
        match = decide(self.engine, plan_match, prompt)
        if match.length:
            self.engine.apply(Assign(row, 0, match.slots))
        if match.last_node != ROOT:
            self.engine.apply(Lock(match.last_node))
        slots = decide(self.engine, plan_extend, [(row, len(prompt))],
                       at_head=self.state.page_size > 1)
        if slots is None:  # out of memory: undo the admission
            if match.last_node != ROOT:
                self.engine.apply(Unlock(match.last_node))
            self.engine.apply(ReqFree((row,)))
            return
        self.live[row] = Live(list(prompt), RequestCursor(row, match.length, match.last_node))

    @precondition(lambda self: self.live)
    @rule(data=st.data(), token=st.integers(1, 3))
    def decode(self, data: st.DataObject, token: int) -> None:
        row = data.draw(st.sampled_from(sorted(self.live)))
        if decide(self.engine, plan_decode, [row], at_head=self.state.page_size > 1) is not None:
            self.live[row].tokens.append(token)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def checkpoint(self, data: st.DataObject) -> None:
        row = data.draw(st.sampled_from(sorted(self.live)))
        live = self.live[row]
        live.cursor = decide(self.engine, plan_checkpoint, live.cursor, live.tokens,
                             prompt_len=live.prompt_len, up_to=len(live.tokens),
                             at_head=self.state.page_size > 1)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), finish=st.booleans())
    def release(self, data: st.DataObject, finish: bool) -> None:
        row = data.draw(st.sampled_from(sorted(self.live)))
        live = self.live.pop(row)
        decide(self.engine, plan_release, live.cursor, live.tokens, prompt_len=live.prompt_len,
               owned=len(live.tokens), checkpoint=finish, at_head=self.state.page_size > 1)

    @rule(tokens=st.integers(1, 16))
    def evict(self, tokens: int) -> None:
        decide(self.engine, plan_evict, tokens, at_head=self.state.page_size > 1)

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

    @precondition(lambda self: self.live)
    @rule(data=st.data(), rewrite=st.booleans())
    def free_under_row(self, data: st.DataObject, rewrite: bool) -> None:
        """SGLang frees a request's last page under its row, then rewrites or truncates the row."""
        row = data.draw(st.sampled_from(sorted(self.live)))
        size = self.state.page_size
        record = self.state.requests[row]
        index = (record.allocated - 1) // size
        page = record.pages[index]
        if record.allocated == 0 or self.state.holders.get(page) != (row,) or (
                page in self.state.page_node) or (not rewrite and index == 0):
            return
        self.engine.apply(FreeMapped((page,)))
        with pytest.raises(UseAfterFree):
            sglang_req_to_token(self.engine.view, [row])
        check = self.monitor.check()  # the dangling entry is not read
        assert check.ok, str(check)
        if rewrite:
            fresh = self.state.free_pages.head(1)[0]
            self.engine.apply(Allocate((fresh,)))
            count = record.allocated - index * size
            self.engine.apply(Assign(row, index * size,
                                     tuple(fresh * size + k for k in range(count))))
        else:
            self.engine.apply(Truncate(row, index * size))
            live = self.live[row]
            live.tokens = live.tokens[: index * size]
            live.prompt_len = min(live.prompt_len, index * size)

    # -- checks ------------------------------------------------------------------------
    @invariant()
    def core_invariants_hold(self) -> None:
        assert check(self.state) == []

    @invariant()
    def every_token_reads_its_tag(self) -> None:
        check = self.monitor.check()  # what this step changed (before the full pass clears it)
        assert check.ok, str(check)
        report = self.monitor.verify()
        assert report.ok, str(report)


class CudaExecutorMachine(ExecutorMachine):
    device = "cuda"


TestExecutorMachineCpu = ExecutorMachine.TestCase
TestExecutorMachineCuda = pytest.mark.cuda(CudaExecutorMachine.TestCase)
