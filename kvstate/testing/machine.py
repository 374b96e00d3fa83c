"""``SpecMachine``: a hypothesis state machine that drives the rules and the spec model
side by side.

Every step goes through :meth:`SpecMachine.step`, the single choke point: the
event is applied by the persistent backend (through the overridable :meth:`apply_event`)
and to ``specs.model``; both must accept or both reject, and after an
accepted step ``abstract(state) == model``, every ALWAYS property holds and
every TRANSITIONS property holds on the edge.  On a failure the events so
far are written to ``replay/failures/<MachineName>.msgpack`` (each failing
run overwrites it, so the file ends up holding hypothesis's shrunk example).

Subclass it to check your own executor or rule variant: override
``apply_event`` (and call ``super().apply_event``), or add rules that call
``self.step``.  The machine owns and mutates only its own attributes.
"""

from __future__ import annotations

import pathlib
from typing import Any

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    rule,
)

from kvstate import events as ev
from kvstate.checking.enabled import candidate_events
from kvstate.checking.scopes import Scope
from kvstate.errors import InvalidEvent
from kvstate.backends.persistent import apply_valid as apply
from kvstate.state import ROOT, Geometry, State, initial_state
from kvstate.testing.strategies import MachineScope, boundary_lengths, machine_scopes


class SpecMachine(RuleBasedStateMachine):
    requests = Bundle("requests")
    log_dir = "replay/failures"
    scopes = machine_scopes()
    check_model = True  # False: check only the registered properties (canaries use this)
    state: State
    model: Any
    log: list[ev.Event]

    # -- the choke point ---------------------------------------------------------------
    def apply_event(self, state: State, event: ev.Event) -> State:
        """The implementation under test (the persistent backend by default)."""
        return apply(state, event)

    def step(self, event: ev.Event) -> bool:
        """Apply ``event`` to both sides; True if accepted.  Fails loudly on disagreement."""
        from specs.invariants import check_edge
        from specs.model import ModelReject
        from specs.model import step as model_step

        note(f"event {ev.event_record(event)}")
        try:
            after: State | None = self.apply_event(self.state, event)
            error = ""
        except InvalidEvent as exc:
            after, error = None, exc.precondition
        if not self.check_model:
            model_after, model_error = (None if after is None else self.model), ""
        else:
            try:
                model_after = model_step(self.model, event)
                model_error = ""
            except ModelReject as exc:
                model_after, model_error = None, str(exc)
        if (after is None) != (model_after is None):
            reducer = "rejected: " + error if after is None else "accepted"
            spec = "rejected: " + model_error if model_after is None else "accepted"
            self.fail([event], "refines", f"reducer {reducer}; spec {spec}")
        if after is None:
            return False
        found = check_edge(self.state, event, after)
        if found:
            self.fail([event], found[0][0], found[0][1])
        self.log.append(event)
        self.state, self.model = after, model_after
        return True

    def fail(self, extra: list[ev.Event], name: str, message: str) -> None:
        from kvstate.checking.counterexample import write_event_log

        path = pathlib.Path(self.log_dir) / f"{type(self).__name__}.msgpack"
        write_event_log(path, self.state.geometry, self.log + extra, [name],
                        origin="hypothesis", note=message)
        raise AssertionError(f"[{name}] {message} (log: {path})")

    # -- configuration -----------------------------------------------------------------
    @initialize(scope=scopes)
    def init_scope(self, scope: MachineScope) -> None:
        from specs.abstraction import abstract

        self.scope = scope
        geometry = Geometry(scope.num_pages, scope.page_size, scope.num_rows,
                            scope.num_pages * scope.page_size)
        self.state = initial_state(geometry)
        self.model = abstract(self.state)
        self.log = []
        self.event_scope = Scope("machine", "event", scope.num_pages, scope.page_size,
                                 scope.num_rows, scope.vocab, max_depth=0, max_key_pages=2)

    # -- request handles ---------------------------------------------------------------
    @rule(target=requests)
    def open_request(self) -> Any:
        rows = sorted(self.state.free_rows)
        if not rows:
            return multiple()
        self.step(ev.ReqAlloc((rows[0],)))
        return rows[0]

    @rule(request=consumes(requests))
    def close_request(self, request: int) -> None:
        if request in self.state.requests:
            self.step(ev.ReqFree((request,)))

    @rule(request=requests, data=st.data())
    def grow(self, request: int, data: st.DataObject) -> None:
        """Append ``n`` tokens (n near a page boundary): fill the partial page, then fresh pages."""
        record = self.state.requests.get(request)
        if record is None:
            return
        size = self.state.geometry.page_size
        count = data.draw(boundary_lengths(size, max_pages=2), label="tokens")
        position = record.allocated
        slots: list[int] = []
        pages: list[int] = []
        free = sorted(self.state.free_pages)
        for pos in range(position, position + count):
            if pos % size == 0:
                if len(pages) == len(free):
                    break  # as much as fits
                pages.append(free[len(pages)])
                page = pages[-1]
            else:
                page = pages[-1] if pages else record.pages[-1]
            slots.append(page * size + pos % size)
        if slots:
            self.step(ev.Allocate(tuple(pages), ((request, tuple(slots)),)))

    @rule(request=requests)
    def commit(self, request: int) -> None:
        record = self.state.requests.get(request)
        if record is not None:
            self.step(ev.Append(((request, record.allocated),)))

    @rule(request=requests, data=st.data())
    def truncate(self, request: int, data: st.DataObject) -> None:
        record = self.state.requests.get(request)
        if record is not None:
            self.step(ev.Truncate(request, data.draw(st.integers(0, record.allocated))))

    @rule(request=requests, data=st.data())
    def publish(self, request: int, data: st.DataObject) -> None:
        """Insert the request's first own whole pages under a drawn node, with a drawn key."""
        record = self.state.requests.get(request)
        if record is None:
            return
        size = self.state.geometry.page_size
        own = [p for p in record.pages[: record.allocated // size]
               if self.state.holders.get(p) == (request,)]
        if not own:
            return
        count = data.draw(st.integers(1, len(own)), label="pages")
        key = data.draw(st.tuples(*[st.integers(1, self.scope.vocab)] * (count * size)), label="key")
        parent = data.draw(st.sampled_from(sorted(self.state.nodes.keys())), label="parent")
        slots = tuple(p * size + k for p in own[:count] for k in range(size))
        self.step(ev.Insert(parent, key, slots, self.state.next_node_id, self.state.clock + 1,
                            request))

    @rule(data=st.data())
    def any_fact(self, data: st.DataObject) -> None:
        """Any candidate fact event the explorer would try here (legal or not)."""
        events = list(candidate_events(self.state, self.event_scope))
        if events:
            self.step(data.draw(st.sampled_from(events), label="event"))

    @rule(data=st.data())
    def lock_and_evict(self, data: st.DataObject) -> None:
        """Maybe lock one node, then try to evict every leaf (eviction under partial locks)."""
        nodes = sorted(n for n in self.state.nodes.keys() if n != ROOT)
        if not nodes:
            return
        if data.draw(st.booleans(), label="lock first"):
            self.step(ev.Lock(data.draw(st.sampled_from(nodes), label="lock")))
        for node in nodes:
            if node in self.state.nodes and self.state.is_leaf(node):
                self.step(ev.Evict((node,), False))

    @rule(data=st.data())
    def lock_and_split(self, data: st.DataObject) -> None:
        """Lock a multi-page node, then split it (locks must carry over to the new top)."""
        size = self.state.geometry.page_size
        nodes = sorted(n for n, node in self.state.nodes.items() if len(node.key) > size)
        if not nodes:
            return
        node_id = data.draw(st.sampled_from(nodes), label="node")
        self.step(ev.Lock(node_id))
        cuts = list(range(size, len(self.state.nodes[node_id].key), size))
        at = data.draw(st.sampled_from(cuts), label="at")
        self.step(ev.Split(node_id, at, self.state.next_node_id, self.state.clock + 1))

    @rule(request=requests, data=st.data())
    def share_cached(self, request: int, data: st.DataObject) -> None:
        """The request takes a reference on a cached tree page (a vLLM-style prefix hit)."""
        record = self.state.requests.get(request)
        size = self.state.geometry.page_size
        if record is None or record.allocated % size:
            return
        pages = sorted(self.state.page_node.keys())  # pages it already maps must be refused
        if not pages:
            return
        page = data.draw(st.sampled_from(pages), label="page")
        slots = tuple(page * size + k for k in range(size))
        self.step(ev.Share(request, record.allocated, slots))

    # -- after every step ----------------------------------------------------------------
    @invariant()
    def agrees_with_spec(self) -> None:
        from specs.abstraction import abstract, diff
        from specs.invariants import check_state

        if not hasattr(self, "state"):
            return
        got = abstract(self.state)
        if self.check_model and got != self.model:
            self.fail([], "refines", f"reducer and spec differ in {diff(got, self.model)}")
        found = check_state(self.state)
        if found:
            self.fail([], found[0][0], found[0][1])


__all__ = ["SpecMachine"]
