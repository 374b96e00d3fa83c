"""Block-mode and host-tier state machines over both backends and the spec model.

Both step through ``BackendsMachine.step`` (``kvstate.testing.backends_machine``):
persistent backend, live backend and ``specs.model`` side by side, ALWAYS
and TRANSITIONS on every step.

* ``BlockSpecMachine``: vLLM's block pool (``Geometry(mode="block")``): named
  requests, allocation from the queue head with lazy eviction, hits held
  again, cache chains of a request's blocks, releases (caching on and off)
  and every candidate block event the explorer would try.
* ``HostSpecMachine``: the radix machine (``SpecMachine``) on a state with a
  host tier, plus root-closed offloads, splits of backed-up nodes, loads back
  and host frees (evictions to host come from the radix rules).

Each owns and mutates only its own attributes.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from kvstate import events as ev
from kvstate.checking.scopes import BLOCK_KINDS, EVENT_KINDS, Scope
from kvstate.state import DETACHED, ROOT, Geometry, RequestId, block_child_key, initial_state
from kvstate.testing.backends_machine import BackendsMachine
from kvstate.testing.machine import SpecMachine
from kvstate.testing.strategies import MachineScope, machine_scopes

NAMES = ("a", "b", "c")


class BlockSpecMachine(BackendsMachine):
    @initialize(scope=machine_scopes(max_pages=5, page_sizes=(1, 2)))
    def init_block(self, scope: MachineScope) -> None:
        size = scope.page_size
        geometry = Geometry(scope.num_pages, size, 0, scope.num_pages * size, mode="block")
        self.start(scope, initial_state(geometry),
                   Scope("machine-block", "event", scope.num_pages, size, 0, scope.vocab,
                         max_depth=0, kinds=BLOCK_KINDS, mode="block", symmetry=False))

    @rule(name=st.sampled_from(NAMES), count=st.integers(1, 3), hit=st.booleans(),
          data=st.data())
    def admit(self, name: str, count: int, hit: bool, data: st.DataObject) -> None:
        """Open a request, hold a cached hit if any, allocate fresh blocks (lazy eviction)."""
        if name in self.state.requests:
            return
        self.step(ev.ReqAlloc((name,)))
        cached = sorted(self.state.page_node.keys())
        if cached and hit:
            self.step(ev.BlockHold(name, (data.draw(st.sampled_from(cached), label="hit page"),)))
        self.allocate(name, count)

    def allocate(self, holder: RequestId, count: int) -> None:
        head = self.state.free_pages.head(count)
        stale = [(p, self.state.page_node[p]) for p in head if p in self.state.page_node]
        if stale:  # vLLM's get_new_blocks evicts lazily: uncache, then hand out
            self.step(ev.BlockUncache(tuple(p for p, _ in stale), tuple(n for _, n in stale)))
        self.step(ev.BlockAlloc(holder, tuple(head)))

    @rule(count=st.integers(1, 2))
    def pool_alloc(self, count: int) -> None:
        self.allocate(DETACHED, count)

    @rule(data=st.data())
    def cache_table(self, data: st.DataObject) -> None:
        """Cache a request's blocks as one chain from the root (null blocks keep positions)."""
        if not self.state.requests:
            return
        name = data.draw(st.sampled_from(sorted(self.state.requests, key=str)), label="request")
        size = self.state.geometry.page_size
        entries = []
        node, next_id = ROOT, self.state.next_node_id
        for page in self.state.requests[name].pages:
            key = data.draw(st.tuples(*[st.integers(1, self.scope.vocab)] * size), label="key")
            found = self.state.nodes.get(node)
            child = found.children.get(block_child_key(key)) if found is not None else None
            if child is None:
                child, next_id = next_id, next_id + 1
            entries.append((child, key, None, page))
            node = child
        if entries:
            self.step(ev.BlockCache(ROOT, tuple(entries), 0))

    @rule(data=st.data(), caching=st.booleans())
    def finish(self, data: st.DataObject, caching: bool) -> None:
        if not self.state.requests:
            return
        name = data.draw(st.sampled_from(sorted(self.state.requests, key=str)), label="request")
        pages = tuple(p for p in reversed(self.state.requests[name].pages) if p)
        self.step(ev.BlockRelease(name, pages, caching, True))


class HostSpecMachine(SpecMachine):
    @initialize(scope=machine_scopes(max_pages=5, page_sizes=(1, 2)),
                host_pages=st.integers(1, 8))
    def init_scope(self, scope: MachineScope, host_pages: int) -> None:  # type: ignore[override]
        size = scope.page_size
        geometry = Geometry(scope.num_pages, size, scope.num_rows, scope.num_pages * size)
        kinds = (*EVENT_KINDS, "offload", "load", "host_free")
        self.start(scope, initial_state(geometry, host_pages=host_pages),
                   Scope("machine-host", "event", scope.num_pages, size, scope.num_rows,
                         scope.vocab, max_depth=0, max_key_pages=2, kinds=kinds,
                         host_pages=host_pages, symmetry=False))

    @rule(data=st.data())
    def back_up(self, data: st.DataObject) -> None:
        """Offload a node and every ancestor without a copy, top down (root-closed)."""
        nodes = sorted(n for n in self.state.nodes.keys() if n != ROOT)
        if not nodes:
            return
        node_id = data.draw(st.sampled_from(nodes), label="node")
        chain = []
        while node_id != ROOT:
            if node_id not in self.state.host.backup:  # type: ignore[union-attr]
                chain.append(node_id)
            node_id = self.state.nodes[node_id].parent
        for node_id in reversed(chain):
            count = len(self.state.nodes[node_id].pages)
            if not self.step(ev.Offload(node_id, tuple(self.state.host.free_pages.head(count)))):  # type: ignore[union-attr]
                return

    @rule(data=st.data())
    def split_backed_up(self, data: st.DataObject) -> None:
        """Split a node that has a host copy (its host pages must split with it)."""
        host, size = self.state.host, self.state.geometry.page_size
        assert host is not None
        nodes = sorted(n for n in host.backup.keys()
                       if n in self.state.nodes and len(self.state.nodes[n].key) > size)
        if not nodes:
            return
        node_id = data.draw(st.sampled_from(nodes), label="backed-up node")
        at = data.draw(st.sampled_from(range(size, len(self.state.nodes[node_id].key), size)),
                       label="at")
        self.step(ev.Split(node_id, at, self.state.next_node_id, self.state.clock + 1))

    @rule(data=st.data())
    def load_back(self, data: st.DataObject) -> None:
        host = self.state.host
        assert host is not None
        nodes = sorted(n for n, r in host.evicted.items() if r.parent in self.state.nodes)
        if not nodes:
            return
        node_id = data.draw(st.sampled_from(nodes), label="host-only node")
        count = len(host.evicted[node_id].key) // self.state.geometry.page_size
        self.step(ev.Load(node_id, tuple(self.state.free_pages.head(count)), self.state.clock + 1))

    @rule(data=st.data(), at_head=st.booleans())
    def drop_host_copy(self, data: st.DataObject, at_head: bool) -> None:
        host = self.state.host
        assert host is not None
        if host.backup:
            node_id = data.draw(st.sampled_from(sorted(host.backup.keys())), label="backed up")
            self.step(ev.HostFree((node_id,), at_head))


__all__ = ["BlockSpecMachine", "HostSpecMachine"]
