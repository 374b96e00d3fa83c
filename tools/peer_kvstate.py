"""kvstate adapter for the peer harness (../shared/peers/sim.py), same interface as its peers.

Drives the planner and reducer directly, with SGLang 0.5.23's call sequence
(match with limit P-1, lock on admission, one batched extend per step,
checkpoint of the prompt after prefill, batched decode, release with
checkpoint on finish).  Every decision is an event applied by the pure
reducer and kept in the engine's event list (recording on), or streamed to a
log file when ``KVSTATE_RECORD`` names one and ``kvstate.log`` is available.

    PYTHONPATH=tools python ../shared/peers/sim.py --peer peer_kvstate --page-size 16 ...
"""

from __future__ import annotations

import gc
import os
from importlib.metadata import version as _version

from kvstate.engine import Engine
from kvstate.events import Assign, Evict, Lock, ReqAlloc
from kvstate.planner import plan_match
from kvstate.planner.alloc import plan_decode, plan_extend
from kvstate.planner.requests import RequestCursor, plan_checkpoint, plan_release
from kvstate.state import ROOT, Geometry


class KReq:
    __slots__ = ("rid", "prompt", "outputs", "row", "prefix_len", "slots", "cursor")

    def __init__(self, rid: int, prompt: list[int]) -> None:
        self.rid = rid
        self.prompt = prompt
        self.outputs: list[int] = []
        self.row = 0
        self.prefix_len = 0
        self.slots: tuple[int, ...] = ()
        self.cursor = RequestCursor(0)


class Peer:
    name = "kvstate"
    version = _version("kvstate")

    def __init__(self, capacity_tokens: int, page_size: int, max_running: int, max_context: int) -> None:
        self.ps = page_size
        self.capacity_tokens = capacity_tokens
        geometry = Geometry(num_pages=capacity_tokens // page_size, page_size=page_size,
                            num_rows=max_running, row_width=max_context)
        self.engine = Engine(geometry, keep_events=True)
        self.name = f"kvstate-ps{page_size}"
        self.pending: list[KReq] = []
        self._evicted = 0
        self.at_head = page_size > 1
        self._recorder = None
        if os.environ.get("KVSTATE_GC_TUNED"):
            # Persistent containers allocate many small tracked objects; a larger
            # young-generation threshold cuts cyclic-GC passes (reported separately).
            gc.set_threshold(100_000, 50, 100)
        path = os.environ.get("KVSTATE_RECORD")
        if path:
            from kvstate.log import Recorder  # type: ignore[attr-defined]

            self._recorder = Recorder(self.engine, path)

    def _commit(self, plan):  # type: ignore[no-untyped-def]
        for event in plan.events:
            if isinstance(event, Evict):
                nodes = plan.base.nodes
                self._evicted += sum(len(nodes[n].key) for n in event.nodes if n in nodes)
        return self.engine.commit(plan)

    # -- lifecycle ---------------------------------------------------------------
    def create(self, r) -> KReq:  # type: ignore[no-untyped-def]
        return KReq(r.rid, list(r.prompt))

    def match(self, req: KReq) -> int:
        result = self._commit(plan_match(self.engine.state, req.prompt, limit=len(req.prompt) - 1))
        req.prefix_len = result.length
        req.slots = result.slots
        req.cursor = RequestCursor(0, result.length, result.last_node)
        return req.prefix_len

    def admit(self, req: KReq) -> bool:
        if req.cursor.last_node != ROOT:
            self.engine.apply(Lock(req.cursor.last_node))
        self.pending.append(req)
        return True

    def flush_admissions(self) -> None:
        reqs, self.pending = self.pending, []
        if not reqs:
            return
        rows = list(reversed(self.engine.state.free_rows.head(len(reqs))))
        self.engine.apply(ReqAlloc(tuple(rows)))
        for req, row in zip(reqs, rows, strict=True):
            req.row = row
            req.cursor = RequestCursor(row, req.cursor.protected_len, req.cursor.last_node)
            if req.prefix_len:
                self.engine.apply(Assign(row, 0, req.slots))
        plan = plan_extend(self.engine.state, [(r.row, len(r.prompt)) for r in reqs],
                           at_head=self.at_head)
        if plan is None:
            raise RuntimeError("kvstate: prefill OOM")
        self._commit(plan)

    def append_first(self, req: KReq, tok: int, done: bool) -> None:
        req.outputs.append(tok)
        if not done:
            plan = plan_checkpoint(self.engine.state, req.cursor, req.prompt,
                                   prompt_len=len(req.prompt), up_to=len(req.prompt),
                                   at_head=self.at_head)
            req.cursor = self._commit(plan)

    def decode_alloc(self, reqs: list[KReq]) -> None:
        plan = plan_decode(self.engine.state, [r.row for r in reqs], at_head=self.at_head)
        if plan is None:
            raise RuntimeError("kvstate: decode OOM (would retract)")
        self._commit(plan)

    def append(self, req: KReq, tok: int) -> None:
        req.outputs.append(tok)

    def finish(self, req: KReq, final_len: int) -> None:
        tokens = req.prompt + req.outputs
        plan = plan_release(self.engine.state, req.cursor, tokens, prompt_len=len(req.prompt),
                            owned=final_len, checkpoint=True, at_head=self.at_head)
        self._commit(plan)

    # -- stats ---------------------------------------------------------------
    def avail_tokens(self) -> int:
        state = self.engine.state
        return state.available_tokens() + state.evictable_size

    def used_tokens(self) -> int:
        return self.capacity_tokens - self.avail_tokens()

    def evicted_tokens(self) -> int:
        return self._evicted
