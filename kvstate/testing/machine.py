"""``SpecMachine``: the radix-mode state machine over both backends and the spec model.

Every step goes through ``BackendsMachine.step`` (``kvstate.testing.backends_machine``):
the persistent backend, a live backend and ``specs.model`` side by side.
The rules here open and close rows, grow tables across page boundaries,
commit, truncate, publish pages into the tree, lock, split and evict, share
cached pages, and draw any candidate fact event the explorer would try
(including ``Scatter`` and ``FreeMapped``).

Subclass it to check your own executor or rule variant: override
``apply_event`` (and call ``super().apply_event``), or add rules that call
``self.step``.  The machine owns and mutates only its own attributes.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, consumes, initialize, multiple, rule

from kvstate import events as ev
from kvstate.checking.scopes import EVENT_KINDS, Scope
from kvstate.state import ROOT, Geometry, initial_state
from kvstate.testing.backends_machine import BackendsMachine
from kvstate.testing.strategies import MachineScope, boundary_lengths, machine_scopes


class SpecMachine(BackendsMachine):
    requests = Bundle("requests")
    scopes = machine_scopes()

    @initialize(scope=scopes)
    def init_scope(self, scope: MachineScope) -> None:
        geometry = Geometry(scope.num_pages, scope.page_size, scope.num_rows,
                            scope.num_pages * scope.page_size)
        self.start(scope, initial_state(geometry),
                   Scope("machine", "event", scope.num_pages, scope.page_size, scope.num_rows,
                         scope.vocab, max_depth=0, max_key_pages=2,
                         kinds=(*EVENT_KINDS, "scatter", "free_mapped")))

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


__all__ = ["SpecMachine"]
