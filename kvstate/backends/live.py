"""The live backend: ``LiveState``, the rules applied in place to plain containers.

A ``LiveState`` has every field of ``State`` under the same name, in
``dict``s, ``LiveQueue``s and mutable records, and is itself the store the
rules edit (``kvstate.rules.store``).  A rejected event raises
``InvalidEvent`` and changes nothing (every rule checks before it writes).

Ownership: one ``LiveState`` belongs to one engine (or one replay loop); it
is never shared.  Readers that take a frozen ``State`` (invariants, the
canonical encoding, the planner) take a ``LiveState`` as well, because both
have the same attribute names.  ``thaw`` and ``freeze`` convert in
O(state); the engine avoids most freezes (``kvstate.engine``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from immutables import Map

from kvstate.errors import InvalidEvent
from kvstate.events import Event
from kvstate.freequeue import LiveQueue
from kvstate.records import MNode, MRequest, RequestId, freeze_node, freeze_request, thaw_request
from kvstate.rules import Reject
from kvstate.rules.registry import Rule, refusal, rules_for
from kvstate.rules.store import Touched
from kvstate.state import (
    Geometry,
    HostTier,
    MambaTier,
    Node,
    State,
    SwaTier,
    empty_host_tier,
    empty_mamba_tier,
    empty_swa_tier,
    initial_state,
)


class Pinned(dict[Any, Any]):
    """A ``dict`` the cyclic garbage collector never stops tracking.

    CPython untracks an exact ``dict`` whose keys and values are all untracked
    (ints, and tuples of ints once a collection has seen them), then tracks it
    again, in the youngest generation, as soon as a fresh tuple is stored in
    it.  The next young collection then walks the whole dict: at a million
    pages that is about 40 ms, paid again after every collection.  Instances
    of a subclass are tracked for good, so a big map stays in the old
    generation and young collections cost what was allocated since the last
    one.  Used for every live map whose keys or values are tuples.
    """

    __slots__ = ()


class LiveHost:
    """The host tier in mutable containers (fields as ``kvstate.state.HostTier``)."""

    __slots__ = ("num_pages", "free_pages", "backup", "owner", "evicted", "evicted_children")

    def __init__(self, tier: HostTier) -> None:
        self.num_pages = tier.num_pages
        self.free_pages = tier.free_pages.thaw()
        self.backup = Pinned(tier.backup.items())
        self.owner = dict(tier.owner.items())
        self.evicted = Pinned(tier.evicted.items())
        self.evicted_children = Pinned(tier.evicted_children.items())

    def host_children(self, node_id: int) -> list[int]:
        return [child for (parent, _), child in self.evicted_children.items() if parent == node_id]

    def snapshot(self, name: str) -> Any:
        return getattr(self, name)

    def freeze(self) -> HostTier:
        return HostTier(self.num_pages, self.free_pages.freeze(), Map(self.backup), Map(self.owner),
                        Map(self.evicted), Map(self.evicted_children))


class LiveSwa:
    """The SWA pool in mutable containers (fields as ``kvstate.state.SwaTier``)."""

    __slots__ = ("num_pages", "free_pages", "peer", "next_uuid", "evictable", "protected")

    def __init__(self, tier: SwaTier) -> None:
        self.num_pages = tier.num_pages
        self.free_pages = tier.free_pages.thaw()
        self.peer = dict(tier.peer.items())
        self.next_uuid = tier.next_uuid
        self.evictable = tier.evictable
        self.protected = tier.protected

    def snapshot(self, name: str) -> Any:
        return getattr(self, name)

    def freeze(self) -> SwaTier:
        return SwaTier(self.num_pages, self.free_pages.freeze(), Map(self.peer), self.next_uuid,
                       self.evictable, self.protected)


class LiveMamba:
    """The Mamba pool in mutable containers (fields as ``kvstate.state.MambaTier``)."""

    __slots__ = ("num_slots", "free_slots", "held", "rows", "nodes", "slot_node", "evictable",
                 "protected")

    def __init__(self, tier: MambaTier) -> None:
        self.num_slots = tier.num_slots
        self.free_slots = tier.free_slots.thaw()
        self.held = dict(tier.held.items())
        self.rows = Pinned(tier.rows.items())
        self.nodes = Pinned(tier.nodes.items())
        self.slot_node = dict(tier.slot_node.items())
        self.evictable = tier.evictable
        self.protected = tier.protected

    def snapshot(self, name: str) -> Any:
        return getattr(self, name)

    def freeze(self) -> MambaTier:
        return MambaTier(self.num_slots, self.free_slots.freeze(), Map(self.held), Map(self.rows),
                         Map(self.nodes), Map(self.slot_node), self.evictable, self.protected)


class LiveState:
    """Every field of ``State`` in mutable containers; applies events in place."""

    __slots__ = ("geometry", "seq", "clock", "free_pages", "holders", "page_node", "free_rows",
                 "row_generation", "requests", "nodes", "next_node_id", "evictable_size",
                 "protected_size", "leaves", "tree_refs", "host", "swa", "mamba", "touched",
                 "request_w", "node_w", "rules")

    geometry: Geometry
    seq: int
    clock: int
    free_pages: LiveQueue
    holders: dict[int, tuple[RequestId, ...]]
    page_node: dict[int, int]
    free_rows: LiveQueue
    row_generation: dict[int, int]
    requests: dict[RequestId, MRequest]
    nodes: dict[int, MNode]
    next_node_id: int
    evictable_size: int
    protected_size: int
    leaves: dict[int, None]
    tree_refs: dict[int, int]
    host: LiveHost | None
    swa: LiveSwa | None
    mamba: LiveMamba | None
    touched: Touched | None
    request_w: Callable[[RequestId], MRequest]  # the store's write access (see thaw)
    node_w: Callable[[int], MNode]
    rules: dict[type[Event], Rule]  # the rules of this geometry's mode (``rules_for``)

    @classmethod
    def thaw(cls, state: State) -> LiveState:
        """A live copy of ``state`` (``state`` itself is not changed).  O(state)."""
        live = cls.__new__(cls)
        live.geometry = state.geometry
        live.seq = state.seq
        live.clock = state.clock
        live.free_pages = state.free_pages.thaw()
        live.holders = Pinned(state.holders.items())
        live.page_node = dict(state.page_node.items())
        live.free_rows = state.free_rows.thaw()
        live.row_generation = dict(state.row_generation.items())
        live.requests = {rid: thaw_request(r) for rid, r in state.requests.items()}
        live.nodes = {nid: MNode(n.parent, n.key, n.pages, dict(n.children.items()), n.lock_ref,
                                 n.last_access, n.extra, n.below, n.swa)
                      for nid, n in state.nodes.items()}
        live.next_node_id = state.next_node_id
        live.evictable_size = state.evictable_size
        live.protected_size = state.protected_size
        live.leaves = dict(state.leaves.items())
        live.tree_refs = dict(state.tree_refs.items())
        live.host = None if state.host is None else LiveHost(state.host)
        live.swa = None if state.swa is None else LiveSwa(state.swa)
        live.mamba = None if state.mamba is None else LiveMamba(state.mamba)
        live.touched = None
        # The store's write access is the record itself: bound C lookups, no Python frame
        # (the dicts are never replaced, so the bindings stay right).
        live.request_w = live.requests.__getitem__
        live.node_w = live.nodes.__getitem__
        live.rules = rules_for(state.geometry.mode)
        return live

    @classmethod
    def empty(cls, geometry: Geometry, *, host_pages: int = 0, swa_pages: int = 0,
              mamba_slots: int = 0) -> LiveState:
        return cls.thaw(initial_state(geometry, host_pages=host_pages, swa_pages=swa_pages,
                                      mamba_slots=mamba_slots))

    def freeze(self) -> State:
        """A frozen ``State`` equal to this one (this one stays usable).  O(state)."""
        nodes: dict[int, Node] = {nid: freeze_node(n) for nid, n in self.nodes.items()}
        return State(
            geometry=self.geometry,
            seq=self.seq,
            clock=self.clock,
            free_pages=self.free_pages.freeze(),
            holders=Map(self.holders),
            page_node=Map(self.page_node),
            free_rows=self.free_rows.freeze(),
            row_generation=Map(self.row_generation),
            requests=Map({rid: freeze_request(r) for rid, r in self.requests.items()}),
            nodes=Map(nodes),
            next_node_id=self.next_node_id,
            evictable_size=self.evictable_size,
            protected_size=self.protected_size,
            leaves=Map(self.leaves),
            tree_refs=Map(self.tree_refs),
            host=None if self.host is None else self.host.freeze(),
            swa=None if self.swa is None else self.swa.freeze(),
            mamba=None if self.mamba is None else self.mamba.freeze(),
        )

    # -- applying ---------------------------------------------------------------------
    def apply(self, event: Event) -> None:
        """Apply a well-typed event in place; ``InvalidEvent`` (nothing changed) if illegal."""
        rule = self.rules.get(type(event))
        if rule is None:
            raise InvalidEvent(event, self.seq, refusal(type(event), self.geometry.mode))
        try:
            rule(self, event)
        except Reject as exc:
            raise InvalidEvent(event, self.seq, str(exc)) from None
        self.seq += 1

    # -- the store interface (kvstate.rules.store) ------------------------------------
    def open_request(self, request_id: RequestId) -> None:
        self.requests[request_id] = MRequest([])

    def close_request(self, request_id: RequestId) -> None:
        del self.requests[request_id]

    def add_node(self, node_id: int, node: MNode) -> None:
        self.nodes[node_id] = node

    def drop_node(self, node_id: int) -> None:
        del self.nodes[node_id]

    def new_children(self) -> dict[Any, int]:
        return {}

    def clear(self, name: str) -> None:
        setattr(self, name, {})
        if name in ("requests", "nodes"):  # keep the write accessors bound to the new dicts
            self.request_w = self.requests.__getitem__
            self.node_w = self.nodes.__getitem__

    def snapshot(self, name: str) -> Any:
        return getattr(self, name)

    def new_queue(self, lo: int, hi: int, *, desc: bool = False) -> LiveQueue:
        return LiveQueue(lo, hi, desc=desc)

    def reset_host(self) -> None:
        if self.host is not None:
            self.host = LiveHost(empty_host_tier(self.host.num_pages))

    def reset_swa(self) -> None:
        """Every SWA page free again, in order (receipts keep counting up)."""
        if self.swa is not None:
            self.swa = LiveSwa(empty_swa_tier(self.swa.num_pages, self.swa.next_uuid))

    def reset_mamba(self) -> None:
        """Every Mamba slot free again, in order; no row or node keeps one."""
        if self.mamba is not None:
            self.mamba = LiveMamba(empty_mamba_tier(self.mamba.num_slots))

    # -- readers shared with State ---------------------------------------------------
    @property
    def page_size(self) -> int:
        return self.geometry.page_size

    def available_tokens(self) -> int:
        return len(self.free_pages) * self.geometry.page_size

    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    def fingerprint(self) -> bytes:
        """The fingerprint this state would have frozen (computed in place, O(state))."""
        from kvstate.canonical import fingerprint

        return fingerprint(self)
