"""The persistent backend: ``apply(state, event) -> State`` (pure and total).

A rule runs against a ``Transaction``: a store whose containers are opened
lazily over the frozen state (``immutables`` map mutations, records thawed
on first write) and finished into a new ``State`` when the rule returns.
The input state is never touched, and everything the new state does not
change it shares with the old one, so a step costs what the event touches.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from immutables import Map

from kvstate.errors import InvalidEvent
from kvstate.events import Event, EventDecodeError, validated
from kvstate.freequeue import FreeQueue
from kvstate.records import MNode, MRequest, Request, RequestId, freeze_node, freeze_request, thaw_request
from kvstate.rules import Reject
from kvstate.rules.registry import refusal, rules_for
from kvstate.rules.store import Touched
from kvstate.state import (
    STATE_FIELDS,
    HostTier,
    MambaTier,
    State,
    SwaTier,
    empty_host_tier,
    empty_mamba_tier,
    empty_swa_tier,
)

_MAPS = frozenset({"holders", "page_node", "row_generation", "tree_refs", "leaves", "requests",
                   "nodes"})
_QUEUES = frozenset({"free_pages", "free_rows"})
_HOST_MAPS = ("backup", "owner", "evicted", "evicted_children")
EMPTY_REQUEST = Request()


class HostTransaction:
    """The host tier's containers opened for one event (lazily, like ``Transaction``)."""

    def __init__(self, tier: HostTier) -> None:
        self._tier = tier
        self.num_pages = tier.num_pages

    def __getattr__(self, name: str) -> Any:
        if name in _HOST_MAPS:
            value: Any = getattr(self._tier, name).mutate()
        elif name == "free_pages":
            value = self._tier.free_pages
        else:
            raise AttributeError(name)
        self.__dict__[name] = value
        return value

    def snapshot(self, name: str) -> Any:
        return _snapshot(self, name)

    def finish(self) -> HostTier:
        opened = self.__dict__
        fields: dict[str, Any] = {"num_pages": self.num_pages}
        for name in (*_HOST_MAPS, "free_pages"):
            value = opened.get(name)
            if value is None:
                fields[name] = getattr(self._tier, name)
            else:
                fields[name] = value if name == "free_pages" else value.finish()
        return HostTier(**fields)


class SwaTransaction:
    """The SWA pool opened for one event (its map lazily, like ``Transaction``'s)."""

    def __init__(self, tier: SwaTier) -> None:
        self._tier = tier
        self.num_pages = tier.num_pages
        self.free_pages = tier.free_pages
        self.next_uuid = tier.next_uuid
        self.evictable = tier.evictable
        self.protected = tier.protected

    def __getattr__(self, name: str) -> Any:
        if name != "peer":
            raise AttributeError(name)
        value = self.__dict__[name] = self._tier.peer.mutate()
        return value

    def snapshot(self, name: str) -> Any:
        return _snapshot(self, name)

    def finish(self) -> SwaTier:
        opened = self.__dict__.get("peer")
        peer = self._tier.peer if opened is None else opened.finish()
        return SwaTier(self.num_pages, self.free_pages, peer, self.next_uuid, self.evictable,
                       self.protected)


_MAMBA_MAPS = ("held", "rows", "nodes", "slot_node")


class MambaTransaction:
    """The Mamba pool opened for one event (its maps lazily, like ``Transaction``'s)."""

    def __init__(self, tier: MambaTier) -> None:
        self._tier = tier
        self.num_slots = tier.num_slots
        self.free_slots = tier.free_slots
        self.evictable = tier.evictable
        self.protected = tier.protected

    def __getattr__(self, name: str) -> Any:
        if name not in _MAMBA_MAPS:
            raise AttributeError(name)
        value = self.__dict__[name] = getattr(self._tier, name).mutate()
        return value

    def snapshot(self, name: str) -> Any:
        return _snapshot(self, name)

    def finish(self) -> MambaTier:
        opened = self.__dict__
        maps = {name: getattr(self._tier, name) if name not in opened else opened[name].finish()
                for name in _MAMBA_MAPS}
        return MambaTier(num_slots=self.num_slots, free_slots=self.free_slots,
                         evictable=self.evictable, protected=self.protected, **maps)


class Transaction:
    """A store over a frozen ``State`` for one event (see ``kvstate.rules.store``)."""

    def __init__(self, state: State, touched: Touched | None = None) -> None:
        self._state = state
        self.geometry = state.geometry
        self.clock = state.clock
        self.next_node_id = state.next_node_id
        self.evictable_size = state.evictable_size
        self.protected_size = state.protected_size
        self.touched = touched
        self._requests_w: dict[RequestId, MRequest] = {}
        self._nodes_w: dict[int, MNode] = {}

    def __getattr__(self, name: str) -> Any:
        # First use of a container: open it (later uses find it in __dict__).
        if name in _MAPS:
            value: Any = getattr(self._state, name).mutate()
        elif name in _QUEUES:
            value = getattr(self._state, name)
        elif name == "host":
            tier = self._state.host
            value = None if tier is None else HostTransaction(tier)
        elif name == "swa":
            pool = self._state.swa
            value = None if pool is None else SwaTransaction(pool)
        elif name == "mamba":
            states = self._state.mamba
            value = None if states is None else MambaTransaction(states)
        else:
            raise AttributeError(name)
        self.__dict__[name] = value
        return value

    # -- records ---------------------------------------------------------------
    def request_w(self, request_id: RequestId) -> MRequest:
        record = self._requests_w.get(request_id)
        if record is None:
            requests = self.requests
            record = self._requests_w[request_id] = thaw_request(requests[request_id])
            requests[request_id] = record
        return record

    def open_request(self, request_id: RequestId) -> None:
        self.requests[request_id] = EMPTY_REQUEST

    def close_request(self, request_id: RequestId) -> None:
        del self.requests[request_id]
        self._requests_w.pop(request_id, None)

    def node_w(self, node_id: int) -> MNode:
        node = self._nodes_w.get(node_id)
        if node is None:
            nodes = self.nodes
            frozen = nodes[node_id]
            node = MNode(frozen.parent, frozen.key, frozen.pages, frozen.children.mutate(),
                         frozen.lock_ref, frozen.last_access, frozen.extra, frozen.below,
                         frozen.swa)
            self._nodes_w[node_id] = nodes[node_id] = node
        return node

    def add_node(self, node_id: int, node: MNode) -> None:
        self._nodes_w[node_id] = self.nodes[node_id] = node

    def drop_node(self, node_id: int) -> None:
        del self.nodes[node_id]
        self._nodes_w.pop(node_id, None)

    def new_children(self) -> Any:
        return Map().mutate()

    def clear(self, name: str) -> None:
        self.__dict__[name] = Map().mutate()

    def snapshot(self, name: str) -> Any:
        return _snapshot(self, name)

    def new_queue(self, lo: int, hi: int, *, desc: bool = False) -> FreeQueue:
        return FreeQueue.from_range(lo, hi, desc=desc)

    def reset_host(self) -> None:
        tier = self._state.host
        if tier is not None:
            self.__dict__["host"] = HostTransaction(empty_host_tier(tier.num_pages))

    def reset_swa(self) -> None:
        """Every SWA page free again, in order (receipts keep counting up)."""
        swa = self.swa
        if swa is not None:
            self.__dict__["swa"] = SwaTransaction(empty_swa_tier(swa.num_pages, swa.next_uuid))

    def reset_mamba(self) -> None:
        """Every Mamba slot free again, in order; no row or node keeps one."""
        mamba = self.mamba
        if mamba is not None:
            self.__dict__["mamba"] = MambaTransaction(empty_mamba_tier(mamba.num_slots))

    # -- the new state ------------------------------------------------------------
    def finish(self, seq: int) -> State:
        opened = self.__dict__
        if self._requests_w:
            requests = self.requests
            for request_id, record in self._requests_w.items():
                requests[request_id] = freeze_request(record)
        if self._nodes_w:
            nodes = self.nodes
            for node_id, node in self._nodes_w.items():
                nodes[node_id] = freeze_node(node)
        state = self._state
        values: list[Any] = []
        for name in STATE_FIELDS:
            if name == "seq":
                values.append(seq)
            elif name in ("geometry", "clock", "next_node_id", "evictable_size", "protected_size"):
                values.append(opened[name])
            elif name not in opened:
                values.append(getattr(state, name))
            elif name in _MAPS:
                values.append(opened[name].finish())
            elif name in ("host", "swa", "mamba"):
                tier = opened[name]
                values.append(None if tier is None else tier.finish())
            else:
                values.append(opened[name])
        return State(*values)


def _snapshot(store: Any, name: str) -> Map[Any, Any]:
    """The map ``name`` as it is now, to iterate: a mutation is finished and reopened (O(1))."""
    current = getattr(store, name)
    if not hasattr(current, "finish"):
        return current  # type: ignore[no-any-return]
    frozen = current.finish()
    store.__dict__[name] = frozen.mutate()
    return frozen  # type: ignore[no-any-return]


def apply_valid(state: State, event: Event, touched: Touched | None = None) -> State:
    """Apply an event whose fields are well typed (planners, decoded logs, the explorer).

    Raises ``InvalidEvent`` (the state is untouched) when it is not legal here.
    """
    rule = rules_for(state.geometry.mode).get(type(event))
    if rule is None:
        raise InvalidEvent(event, state.seq, refusal(type(event), state.geometry.mode))
    txn = Transaction(state, touched)
    try:
        rule(txn, event)
    except Reject as exc:
        raise InvalidEvent(event, state.seq, str(exc)) from None
    return txn.finish(state.seq + 1)


def apply(state: State, event: Event) -> State:
    """Apply one event: the new state, or ``InvalidEvent`` with ``state`` unchanged.

    Total: a field of the wrong type or range is an ``InvalidEvent`` too.
    """
    try:
        event = validated(event)
    except EventDecodeError as exc:
        raise InvalidEvent(event, state.seq, str(exc)) from None
    return apply_valid(state, event)


def apply_all(state: State, events: Iterable[Event]) -> State:
    """Fold ``apply`` over ``events``; stops at (and raises) the first invalid one."""
    for evt in events:
        state = apply(state, evt)
    return state
