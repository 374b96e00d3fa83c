"""kvstate adapter for the peer harness (../shared/peers/sim.py), same interface as its peers.

Drives the planner directly on the live engine, with SGLang 0.5.23's call
sequence (match with limit P-1, lock on admission, one batched extend per
step, checkpoint of the prompt after prefill, batched decode, release with
checkpoint on finish).  Every decision is events applied by the rules and
recorded: kept in the engine's event list, or streamed to a log file when
``KVSTATE_RECORD`` names one.  (``peer_kvstate_sglang`` drives the public
SGLang front end instead.)

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
        record = os.environ.get("KVSTATE_RECORD")
        self.engine = Engine(geometry, keep_events=not record)
        self.name = f"kvstate-ps{page_size}"
        self.pending: list[KReq] = []
        self._evicted = 0
        self.at_head = page_size > 1
        self._recorder = None
        if os.environ.get("KVSTATE_GC_TUNED"):
            # Many small tracked objects; a larger young-generation threshold cuts
            # cyclic-GC passes (reported separately).
            gc.set_threshold(100_000, 50, 100)
        if record:
            from kvstate.log import Recorder

            self._recorder = Recorder(self.engine, record)
        self.engine.subscribe(self)  # counts evicted tokens

    def before(self, event, view):  # type: ignore[no-untyped-def]
        if type(event) is Evict:
            nodes = view.nodes
            self._evicted += sum(len(nodes[n].key) for n in event.nodes if n in nodes)

    def discard(self, event):  # type: ignore[no-untyped-def]
        pass

    def after(self, events, view):  # type: ignore[no-untyped-def]
        pass

    # -- lifecycle ---------------------------------------------------------------
    def create(self, r) -> KReq:  # type: ignore[no-untyped-def]
        return KReq(r.rid, list(r.prompt))

    def match(self, req: KReq) -> int:
        with self.engine.batch() as b:
            result = plan_match(b, req.prompt, limit=len(req.prompt) - 1)
        req.prefix_len = result.length
        req.slots = result.slots
        req.cursor = RequestCursor(0, result.length, result.last_node)
        return req.prefix_len

    def admit(self, req: KReq) -> bool:
        if req.cursor.last_node != ROOT:
            with self.engine.batch() as b:
                b.emit(Lock(req.cursor.last_node))
        self.pending.append(req)
        return True

    def flush_admissions(self) -> None:
        reqs, self.pending = self.pending, []
        if not reqs:
            return
        engine = self.engine
        with engine.batch() as b:
            rows = list(reversed(b.state.free_rows.head(len(reqs))))
            b.emit(ReqAlloc(tuple(rows)))
            for req, row in zip(reqs, rows, strict=True):
                req.row = row
                req.cursor = RequestCursor(row, req.cursor.protected_len, req.cursor.last_node)
                if req.prefix_len:
                    b.emit(Assign(row, 0, req.slots))
            slots = plan_extend(b, [(r.row, len(r.prompt)) for r in reqs], at_head=self.at_head)
            if slots is None:
                raise RuntimeError("kvstate: prefill OOM")

    def append_first(self, req: KReq, tok: int, done: bool) -> None:
        req.outputs.append(tok)
        if not done:
            with self.engine.batch() as b:
                req.cursor = plan_checkpoint(b, req.cursor, req.prompt, prompt_len=len(req.prompt),
                                             up_to=len(req.prompt), at_head=self.at_head)

    def decode_alloc(self, reqs: list[KReq]) -> None:
        with self.engine.batch() as b:
            slots = plan_decode(b, [r.row for r in reqs], at_head=self.at_head)
        if slots is None:
            raise RuntimeError("kvstate: decode OOM (would retract)")

    def append(self, req: KReq, tok: int) -> None:
        req.outputs.append(tok)

    def finish(self, req: KReq, final_len: int) -> None:
        tokens = req.prompt + req.outputs
        with self.engine.batch() as b:
            plan_release(b, req.cursor, tokens, prompt_len=len(req.prompt), owned=final_len,
                         checkpoint=True, at_head=self.at_head)

    # -- stats ---------------------------------------------------------------
    def avail_tokens(self) -> int:
        state = self.engine.view
        return len(state.free_pages) * self.ps + state.evictable_size

    def used_tokens(self) -> int:
        return self.capacity_tokens - self.avail_tokens()

    def evicted_tokens(self) -> int:
        return self._evicted
