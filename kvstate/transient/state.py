"""A mutable mirror of ``State`` for fast replay: thaw once, apply many, freeze when asked.

Ownership: a ``TransientState`` belongs to exactly one ``TransientApplier``
and is mutated in place by the rules in ``kvstate.transient``; nobody else
may hold a reference into it.  ``thaw`` copies a frozen ``State`` into fresh
containers (the frozen state is never touched) and ``freeze`` builds a new
frozen ``State`` equal to the one the pure reducer would have produced (same
fingerprint, same derived ``leaves`` and ``tree_refs`` indices).

Why a second representation exists: the pure reducer rebuilds persistent
maps and a 15-field state per event (about 15 us), which caps replay near
60k events/s.  Plain dicts and lists cost a few hundred ns per change.  The
pure reducer stays the definition: every rule here is checked against it
event by event (``tests/test_transient.py``), and anything a rule does not
accept goes through the pure reducer itself.

Free queues are ``OrderedDict``s in queue order (``OrderedQueue``): every
push, removal and head read is O(1) per page, as vLLM's linked free list is.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from itertools import islice
from typing import Any

from immutables import Map
from pyrsistent import pvector

from kvstate.freequeue import FreeQueue
from kvstate.state import Geometry, Node, Request, RequestId, State


class TNode:
    """A tree node, mutable (fields as in ``kvstate.state.Node``).

    Two transient-only fields: ``below``, the sum of the children's
    ``lock_ref``, so an unlock checks "holds a lock of its own" without
    walking every child (a shared system prompt may have hundreds); and
    ``frozen``, the ``Node`` this node froze to last, reused by ``freeze``
    until a rule changes the node.  Every rule that writes a node field
    clears ``frozen`` (tests freeze after every event to keep that honest).
    """

    __slots__ = ("parent", "key", "pages", "children", "lock_ref", "last_access", "extra", "below",
                 "frozen")

    def __init__(self, parent: int, key: tuple[int, ...], pages: tuple[int, ...],
                 children: dict[Any, int], lock_ref: int, last_access: int, extra: Any = None,
                 below: int = 0, frozen: Node | None = None) -> None:
        self.parent = parent
        self.key = key
        self.pages = pages
        self.children = children
        self.lock_ref = lock_ref
        self.last_access = last_access
        self.extra = extra
        self.below = below
        self.frozen = frozen

    def freeze(self) -> Node:
        node = self.frozen
        if node is None:
            node = self.frozen = Node(self.parent, self.key, self.pages, Map(self.children),
                                      self.lock_ref, self.last_access, self.extra)
        return node


class TRequest:
    """A request's table, mutable (fields as in ``kvstate.state.Request``)."""

    __slots__ = ("pages", "allocated", "committed")

    def __init__(self, pages: list[int], allocated: int, committed: int) -> None:
        self.pages = pages
        self.allocated = allocated
        self.committed = committed


class OrderedQueue:
    """A free queue, mutated in place: an ``OrderedDict`` of its items, head first.

    Every operation the reducer's ``FreeQueue`` has, at O(1) per item: a tail
    push appends, a head push moves each item to the front, ``take`` deletes
    wherever the item sits, and the head is the first items in order.
    """

    __slots__ = ("order",)

    def __init__(self, items: Iterable[int]) -> None:
        self.order: OrderedDict[int, None] = OrderedDict.fromkeys(items)

    def __len__(self) -> int:
        return len(self.order)

    def push_tail(self, items: Iterable[int]) -> None:
        order = self.order
        for item in items:
            order[item] = None

    def push_head(self, items: list[int] | tuple[int, ...]) -> None:
        """``items[0]`` becomes the new head."""
        order = self.order
        to_front = order.move_to_end
        for item in reversed(items):
            order[item] = None
            to_front(item, last=False)

    def take(self, items: Iterable[int]) -> None:
        order = self.order
        for item in items:
            del order[item]

    def head(self, count: int) -> list[int]:
        return list(islice(self.order, count))

    def freeze(self) -> FreeQueue:
        return FreeQueue.from_pages(self.order)


class TransientState:
    """Every field of ``State`` in plain mutable containers (see the module docstring)."""

    __slots__ = ("geometry", "seq", "clock", "free_pages", "holders", "page_node", "free_rows",
                 "row_generation", "requests", "nodes", "next_node_id", "evictable_size",
                 "protected_size", "leaves", "tree_refs")

    geometry: Geometry
    seq: int
    clock: int
    free_pages: OrderedQueue
    holders: dict[int, tuple[RequestId, ...]]
    page_node: dict[int, int]
    free_rows: OrderedQueue
    row_generation: dict[int, int]
    requests: dict[RequestId, TRequest]
    nodes: dict[int, TNode]
    next_node_id: int
    evictable_size: int
    protected_size: int
    leaves: dict[int, None]
    tree_refs: dict[int, int]


def thaw(state: State) -> TransientState:
    """A transient copy of ``state`` (``state`` itself is not changed)."""
    out = TransientState()
    out.geometry = state.geometry
    out.seq = state.seq
    out.clock = state.clock
    out.free_pages = OrderedQueue(state.free_pages)
    out.holders = dict(state.holders.items())
    out.page_node = dict(state.page_node.items())
    out.free_rows = OrderedQueue(state.free_rows)
    out.row_generation = dict(state.row_generation.items())
    out.requests = {rid: TRequest(list(r.pages), r.allocated, r.committed)
                    for rid, r in state.requests.items()}
    nodes = state.nodes
    out.nodes = {nid: TNode(n.parent, n.key, n.pages, dict(n.children.items()), n.lock_ref,
                            n.last_access, n.extra,
                            sum(nodes[child].lock_ref for child in n.children.values()), n)
                 for nid, n in nodes.items()}
    out.next_node_id = state.next_node_id
    out.evictable_size = state.evictable_size
    out.protected_size = state.protected_size
    out.leaves = dict(state.leaves.items())
    out.tree_refs = dict(state.tree_refs.items())
    return out


def freeze(ts: TransientState) -> State:
    """A new frozen ``State`` with ``ts``'s contents (``ts`` stays usable)."""
    requests = Map({rid: Request(pvector(r.pages), r.allocated, r.committed)
                    for rid, r in ts.requests.items()})
    nodes = Map({nid: n.freeze() for nid, n in ts.nodes.items()})
    return State(
        geometry=ts.geometry,
        seq=ts.seq,
        clock=ts.clock,
        free_pages=ts.free_pages.freeze(),
        holders=Map(ts.holders),
        page_node=Map(ts.page_node),
        free_rows=ts.free_rows.freeze(),
        row_generation=Map(ts.row_generation),
        requests=requests,
        nodes=nodes,
        next_node_id=ts.next_node_id,
        evictable_size=ts.evictable_size,
        protected_size=ts.protected_size,
        leaves=Map(ts.leaves),
        tree_refs=Map(ts.tree_refs),
    )
