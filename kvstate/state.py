"""The immutable state of a KV cache: request rows, pages, radix tree, clock.

Ownership (who holds which page)::

    page 0            reserved padding sink, never held, never free
    pages 1..N        exactly one of
                        free      in ``free_pages`` (queue order = reuse order)
                        held      by one or more holders:
                                    the tree  (``page_node[page]`` = node id)
                                    requests  (ids in ``holders[page]``)
                                    DETACHED  (allocated by a bare allocator call,
                                               not yet written into a request row)

A request's table maps token positions to slots through its page table:
``slot(pos) = pages[pos // P] * P + pos % P``.  Table entries may point at
pages the request holds or at tree pages it matched (protected by locks, not
by a hold).  Everything here is frozen; the reducer returns new states that
share structure with the old one, so keeping an old state (a backup, a parent
in the explorer) costs nothing.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Any, NamedTuple

import attrs
from immutables import Map
from pyrsistent import PVector, pvector

from kvstate.freequeue import FreeQueue

DETACHED = 0  # holder id of pages handed out by a bare allocator call
ROOT = 0  # node id of the radix tree's root
RequestId = int | str
ChildKey = int | tuple[Any, ...]
MODES = ("radix", "block")


@attrs.frozen
class Geometry:
    """Sizes fixed for a state's lifetime.

    ``num_rows`` request rows ``1..num_rows`` (0 when only named requests are
    used); ``row_width`` the most tokens one request may map.  ``mode`` is
    ``"radix"`` (SGLang-style tree: tree pages are never free) or ``"block"``
    (vLLM-style block pool: one node per page-sized block, a node may hold
    several physical copies, and a cached page with no holder stays in the
    free queue as an eviction candidate; see ``kvstate.reducer.block``).
    """

    num_pages: int
    page_size: int = 1
    num_rows: int = 0
    row_width: int = 1 << 20
    mode: str = "radix"

    def __attrs_post_init__(self) -> None:
        for name in ("num_pages", "page_size", "row_width"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if isinstance(self.num_rows, bool) or not isinstance(self.num_rows, int):
            raise ValueError(f"num_rows must be an int, got {self.num_rows!r}")
        if self.num_rows < 0:
            raise ValueError(f"num_rows must be >= 0, got {self.num_rows}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    def child_key(self, key: tuple[int, ...]) -> ChildKey:
        """Index of a child under its parent: first token, or first page of tokens."""
        return key[0] if self.page_size == 1 else tuple(key[: self.page_size])


def block_child_key(key: tuple[int, ...], extra: Any = None) -> tuple[Any, ...]:
    """Block mode: a child's index under its parent, its tokens plus its extra keys.

    The extra keys (LoRA, multimodal items, cache salt) join as one trailing
    string (their ``repr``, deterministic for tuples of str/int/bytes), so a
    key compares and sorts like the plain token tuple it extends.
    """
    return tuple(key) if extra is None else (*key, repr(extra))


class Node(NamedTuple):
    """A radix-tree node.  ``pages`` back ``key`` page by page (len(key) == len(pages) * P).

    An immutable record (a NamedTuple: cheap to build on the hot path); change
    it with ``node._replace(...)``.
    """

    parent: int
    key: tuple[int, ...]
    pages: tuple[int, ...]
    children: Map[ChildKey, int]
    lock_ref: int
    last_access: int
    extra: Any = None  # block mode: the block's tagged extra keys (part of its identity)


class Request(NamedTuple):
    """A request's table: ``allocated`` tokens mapped through ``pages``; ``committed`` written."""

    pages: PVector[int]
    allocated: int = 0
    committed: int = 0


EMPTY_REQUEST = Request(pvector())


@attrs.frozen(eq=False)
class State:
    """The whole cache state.  Immutable; equality and hashing go by fingerprint."""

    geometry: Geometry
    seq: int  # events applied so far
    clock: int  # logical time of the latest access stamp
    free_pages: FreeQueue
    holders: Map[int, tuple[RequestId, ...]]  # page -> non-tree holders
    page_node: Map[int, int]  # page -> tree node holding it
    free_rows: FreeQueue  # head = next row handed out
    row_generation: Map[int, int]
    requests: Map[RequestId, Request]
    nodes: Map[int, Node]
    next_node_id: int
    evictable_size: int
    protected_size: int
    # Derived index (not part of the fingerprint): unlocked childless nodes below
    # the root, maintained by the radix-mode tree rules so eviction never scans.
    leaves: Map[int, None] = attrs.field(factory=Map)
    # Derived index (not part of the fingerprint): for each tree page, how many
    # request tables map it without holding it (SGLang's locked prefix).  Such
    # a page must not leave the tree: evicting it would be a use after free.
    tree_refs: Map[int, int] = attrs.field(factory=Map)
    _fingerprint: list[bytes] = attrs.field(factory=list, repr=False, alias="_fingerprint")

    # -- identity ---------------------------------------------------------
    def fingerprint(self) -> bytes:
        """128-bit blake2b of the canonical encoding (cached per state object)."""
        if not self._fingerprint:
            from kvstate.encoding import fingerprint

            self._fingerprint.append(fingerprint(self))
        return self._fingerprint[0]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, State):
            return NotImplemented
        return self is other or self.fingerprint() == other.fingerprint()

    def __hash__(self) -> int:
        return int.from_bytes(self.fingerprint()[:8], "little")

    # -- derived views (read-only) ----------------------------------------
    @property
    def page_size(self) -> int:
        return self.geometry.page_size

    @property
    def root(self) -> Node:
        return self.nodes[ROOT]

    def refcount(self, page: int) -> int:
        """Number of holders of ``page``: requests, DETACHED, and the tree.

        In block mode the tree does not hold (vLLM's ``ref_cnt``: requests and
        pool-level references only).
        """
        held = len(self.holders.get(page, ()))
        if self.geometry.mode == "block":
            return held
        return held + (1 if page in self.page_node else 0)

    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    def available_tokens(self) -> int:
        return len(self.free_pages) * self.geometry.page_size

    def slots_of(self, request_id: RequestId, start: int = 0, stop: int | None = None) -> list[int]:
        """Slots mapped for token positions ``[start, stop)`` of a request."""
        record = self.requests[request_id]
        end = record.allocated if stop is None else min(stop, record.allocated)
        return list(slot_span(record.pages, self.geometry.page_size, start, end))

    def node_slots(self, node_id: int) -> list[int]:
        return list(expand_pages(self.nodes[node_id].pages, self.geometry.page_size))

    def path_to_root(self, node_id: int) -> Iterator[int]:
        """Node ids from ``node_id`` up to (excluding) the root."""
        nodes = self.nodes
        while node_id != ROOT:
            yield node_id
            node_id = nodes[node_id].parent

    def is_leaf(self, node_id: int) -> bool:
        return len(self.nodes[node_id].children) == 0

    def with_changes(self, **changes: Any) -> State:
        """A new state with ``changes`` and a fresh fingerprint cache (hot path: no evolve)."""
        values = list(_FIELD_GETTER(self))
        for name, value in changes.items():
            values[_FIELD_INDEX[name]] = value
        return State(*values)


_STATE_FIELDS = tuple(f.name for f in attrs.fields(State) if f.name != "_fingerprint")
_FIELD_GETTER = operator.attrgetter(*_STATE_FIELDS)
_FIELD_INDEX = {name: index for index, name in enumerate(_STATE_FIELDS)}


def expand_pages(pages: Sequence[int], page_size: int) -> tuple[int, ...]:
    """Every slot of ``pages``, in order (``page * P + offset``)."""
    if page_size == 1:
        return tuple(pages)
    return tuple(chain.from_iterable(range(p * page_size, p * page_size + page_size) for p in pages))


def slot_span(pages: Sequence[int], page_size: int, start: int, stop: int) -> tuple[int, ...]:
    """Slots of token positions ``[start, stop)`` of a page table (positions from 0)."""
    if stop <= start:
        return ()
    first, last = start // page_size, -(-stop // page_size)
    offset = first * page_size
    return expand_pages(pages[first:last], page_size)[start - offset: stop - offset]


def initial_state(geometry: Geometry) -> State:
    """Everything free: pages 1..N in order, rows handed out from the top."""
    root = Node(parent=-1, key=(), pages=(), children=Map(), lock_ref=1, last_access=0)
    return State(
        geometry=geometry,
        seq=0,
        clock=0,
        free_pages=FreeQueue.from_pages(range(1, geometry.num_pages + 1)),
        holders=Map(),
        page_node=Map(),
        free_rows=FreeQueue.from_pages(range(geometry.num_rows, 0, -1)),
        row_generation=Map(),
        requests=Map(),
        nodes=Map({ROOT: root}),
        next_node_id=1,
        evictable_size=0,
        protected_size=0,
    )
