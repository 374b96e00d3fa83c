"""The ``kvstate.sglang`` front end against the spec model.

Reuses the SGLang scheduler machine of ``tests/test_sglang_stateful.py``
(admit with chunked prefill, extend, decode, unfinished caching, finish,
retract, evict over page sizes 1, 2 and 4) and subscribes a listener to the
shared engine: every event the front end applies must be accepted by
``specs.model`` and satisfy every TRANSITIONS property, and after every rule
``abstract(state) == model`` and every ALWAYS property holds.  The listener
sees each event before its rule runs (``before``, the engine's live view),
steps a persistent copy alongside, and compares the two backends'
fingerprints once the batch is applied (``after``).  A failure writes the
events so far to ``replay/failures/SGLangModelMachine.msgpack``.
"""

from __future__ import annotations

import pathlib

import hypothesis.strategies as st
from hypothesis.stateful import initialize, invariant

from kvstate.backends.persistent import apply_valid
from kvstate.checking.counterexample import write_event_log
from kvstate.errors import InvalidEvent
from kvstate.events import Event
from specs.abstraction import abstract, diff
from specs.invariants import check_edge, check_state
from specs.model import ModelReject, step
from tests.test_sglang_stateful import SGLangMachine


class SGLangModelMachine(SGLangMachine):
    @initialize(page_size=st.sampled_from([1, 2, 4]), pages=st.integers(4, 12))
    def setup(self, page_size, pages):
        super().setup(page_size, pages)
        engine = self.cache.engine
        self.spec_state = engine.state
        self.spec_model = abstract(engine.state)
        self.spec_log: list[Event] = []
        engine.subscribe(self)

    def _fail(self, name: str, message: str) -> None:
        path = pathlib.Path("replay/failures") / f"{type(self).__name__}.msgpack"
        write_event_log(path, self.spec_state.geometry, self.spec_log, [name],
                        origin="hypothesis", note=message)
        raise AssertionError(f"[{name}] {message} (log: {path})")

    # -- the engine's listener protocol ----------------------------------------------------
    def before(self, event: Event, view: object) -> None:
        """Step the spec side by the event the engine is about to apply."""
        before = self.spec_state
        self.spec_log.append(event)
        try:
            after = apply_valid(before, event)
        except InvalidEvent:
            return  # the live rule refuses it too (``discard``), or the backends differ (``after``)
        try:
            self.spec_model = step(self.spec_model, event)
        except ModelReject as exc:
            self._fail("refines", f"the front end applied {event!r}, which the spec rejects: {exc}")
        found = check_edge(before, event, after)
        if found:
            self._fail(found[0][0], found[0][1])
        self.spec_state = after

    def discard(self, event: Event) -> None:
        self._fail("refines", f"the front end emitted {event!r}, which the rules refused")

    def after(self, events: object, view: object) -> None:
        if view.fingerprint() != self.spec_state.fingerprint():  # type: ignore[attr-defined]
            self._fail("backends", "the engine's live state and the persistent replay differ")

    @invariant()
    def agrees_with_spec(self):
        if not hasattr(self, "spec_model"):
            return
        got = abstract(self.cache.state)
        if got != self.spec_model:
            self._fail("refines", f"front end state and spec differ in {diff(got, self.spec_model)}")
        found = check_state(self.cache.state)
        if found:
            self._fail(found[0][0], found[0][1])


TestSGLangModelMachine = SGLangModelMachine.TestCase
