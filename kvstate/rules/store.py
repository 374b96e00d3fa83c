"""What a rule may read and write: the ``Store`` protocol both backends implement.

Maps (``holders``, ``page_node``, ``row_generation``, ``tree_refs``,
``leaves``; the host tier's; the SWA pool's ``peer``; the Mamba pool's) are edited with item
syntax: a ``dict`` on the live backend, an ``immutables`` map mutation on the
persistent one.  Queues (``free_pages``, ``free_rows``, ``host.free_pages``,
``swa.free_pages``) return themselves or their successor from every edit, so
a rule always stores the result back.
A rule that must iterate a map takes ``snapshot(name)``: the map as it is
now, to read (a map mutation cannot be iterated).
Records are read through ``requests`` and ``nodes`` and edited only through
``request_w`` / ``node_w`` (which hand out a mutable record: the live one,
or a copy the transaction freezes at the end).  ``touched`` is ``None``
unless incremental checks are on; a rule then adds the pages, nodes,
requests and host nodes it changed (``kvstate.invariants.incremental``).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any, Protocol

from kvstate.records import MNode, MRequest, RequestId
from kvstate.state import Geometry


class Touched:
    """What a run of events changed, for incremental checks.

    ``pages`` and ``nodes`` whose entries changed (``stamped``: nodes whose only
    change was an access time; ``locked``: nodes whose only change was their
    ``lock_ref`` and ``below`` counts, as a lock or an unlock leaves a path);
    ``requests`` maps each request whose record changed to the first table
    index that may have changed (its old length when it only grew);
    ``host_nodes`` for the host tier; ``mamba_slots`` the Mamba slots whose
    owner changed; ``everything`` after a reset.
    """

    __slots__ = ("pages", "nodes", "stamped", "locked", "requests", "host_nodes",
                 "mamba_slots", "everything")

    def __init__(self) -> None:
        self.pages: set[int] = set()
        self.nodes: set[int] = set()
        self.stamped: set[int] = set()
        self.locked: set[int] = set()
        self.requests: dict[RequestId, int] = {}
        self.host_nodes: set[int] = set()
        self.mamba_slots: set[int] = set()
        self.everything = False

    def table(self, request_id: RequestId, index: int) -> None:
        """Request ``request_id`` changed from table index ``index`` on."""
        known = self.requests.get(request_id)
        if known is None or index < known:
            self.requests[request_id] = index

    def clear(self) -> None:
        self.pages.clear()
        self.nodes.clear()
        self.stamped.clear()
        self.locked.clear()
        self.requests.clear()
        self.host_nodes.clear()
        self.mamba_slots.clear()
        self.everything = False


class HostStore(Protocol):
    num_pages: int
    free_pages: Any
    backup: MutableMapping[int, tuple[int, ...]]
    owner: MutableMapping[int, int]
    evicted: MutableMapping[int, Any]
    evicted_children: MutableMapping[tuple[int, Any], int]

    def snapshot(self, name: str) -> Mapping[Any, Any]: ...


class SwaStore(Protocol):
    """The SWA pool (``kvstate.state.SwaTier``): ``peer`` is a map, the rest plain values."""

    num_pages: int
    free_pages: Any
    peer: MutableMapping[int, int]
    next_uuid: int
    evictable: int
    protected: int

    def snapshot(self, name: str) -> Mapping[Any, Any]: ...


class MambaStore(Protocol):
    """The Mamba pool (``kvstate.state.MambaTier``): maps, a queue and two counters."""

    num_slots: int
    free_slots: Any
    held: MutableMapping[int, RequestId]
    rows: MutableMapping[RequestId, tuple[int, ...]]
    nodes: MutableMapping[int, Any]
    slot_node: MutableMapping[int, int]
    evictable: int
    protected: int

    def snapshot(self, name: str) -> Mapping[Any, Any]: ...


class Store(Protocol):
    geometry: Geometry
    clock: int
    next_node_id: int
    evictable_size: int
    protected_size: int
    free_pages: Any
    free_rows: Any
    holders: MutableMapping[int, tuple[RequestId, ...]]
    page_node: MutableMapping[int, int]
    row_generation: MutableMapping[int, int]
    tree_refs: MutableMapping[int, int]
    leaves: MutableMapping[int, None]
    requests: Mapping[RequestId, Any]
    nodes: Mapping[int, Any]
    host: HostStore | None
    swa: SwaStore | None
    mamba: MambaStore | None
    touched: Touched | None

    def request_w(self, request_id: RequestId) -> MRequest: ...
    def open_request(self, request_id: RequestId) -> None: ...
    def close_request(self, request_id: RequestId) -> None: ...
    def node_w(self, node_id: int) -> MNode: ...
    def add_node(self, node_id: int, node: MNode) -> None: ...
    def drop_node(self, node_id: int) -> None: ...
    def new_children(self) -> MutableMapping[Any, int]: ...
    def clear(self, name: str) -> None: ...
    def snapshot(self, name: str) -> Mapping[Any, Any]: ...
    def new_queue(self, lo: int, hi: int, *, desc: bool = False) -> Any: ...
    def reset_swa(self) -> None: ...
    def reset_mamba(self) -> None: ...
