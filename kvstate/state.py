"""The frozen state of a KV cache: request rows, pages, radix tree, clock, host tier.

Ownership (who holds which page)::

    page 0            reserved padding sink, never held, never free
    pages 1..N        exactly one of
                        free      in ``free_pages`` (queue order = reuse order)
                        held      by one or more holders:
                                    the tree  (``page_node[page]`` = node id)
                                    requests  (ids in ``holders[page]``)
                                    DETACHED  (allocated by a bare allocator call,
                                               not yet written into a request row)

A ``State`` is immutable: ``kvstate.apply`` (the persistent backend) returns a
new one that shares structure with the old, so keeping an old state (a backup,
a parent in the explorer) costs nothing.  The live engine keeps the same
fields in mutable containers (``kvstate.backends.live.LiveState``) and
produces a ``State`` on demand.  Every reader (invariants, encoding, planner,
exports) uses only the attribute names defined here, so it takes either.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Any, NamedTuple

import attrs
from immutables import Map

from kvstate import canonical
from kvstate.freequeue import FreeQueue
from kvstate.records import ChildKey, HostNode, Node, Request, RequestId, SwaNode

DETACHED = 0  # holder id of pages handed out by a bare allocator call
ROOT = 0  # node id of the radix tree's root
MODES = ("radix", "block")

__all__ = ["DETACHED", "MODES", "ROOT", "ChildKey", "Geometry", "HostNode", "HostTier", "Node",
           "MambaNode", "MambaTier", "Request", "RequestId", "State", "SwaNode", "SwaTier",
           "block_child_key", "expand_pages", "initial_state", "slot_span"]


@attrs.frozen
class Geometry:
    """Sizes fixed for a state's lifetime.

    ``num_rows`` request rows ``1..num_rows`` (0 when only named requests are
    used); ``row_width`` the most tokens one request may map.  ``mode`` is
    ``"radix"`` (SGLang-style tree: tree pages are never free) or ``"block"``
    (vLLM-style block pool: one node per page-sized block, a node may hold
    several physical copies, and a cached page with no holder stays in the
    free queue as an eviction candidate; see ``kvstate.rules.block``).
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

    def child_key(self, key: Sequence[int]) -> ChildKey:
        """Index of a child under its parent: first token, or first page of tokens."""
        return key[0] if self.page_size == 1 else tuple(key[: self.page_size])


def block_child_key(key: tuple[int, ...], extra: Any = None) -> tuple[Any, ...]:
    """Block mode: a child's index under its parent, its tokens plus its extra keys.

    The extra keys (LoRA, multimodal items, cache salt) join as one trailing
    string (their ``repr``, deterministic for tuples of str/int/bytes), so a
    key compares and sorts like the plain token tuple it extends.
    """
    return tuple(key) if extra is None else (*key, repr(extra))


@attrs.frozen
class HostTier:
    """Where tree nodes' KV lives on the host, besides the device (frozen).

    A tree node is device-only, device + host (in ``backup``), or host-only
    (in ``evicted`` and ``backup``: its device copy was evicted; it keeps its
    id, parent and key and hangs off its parent through ``evicted_children``).
    Host pages are ``0..num_pages-1``; each used one has exactly one owner.
    """

    num_pages: int
    free_pages: FreeQueue
    backup: Map[int, tuple[int, ...]]  # node -> host pages holding its KV (page by page)
    owner: Map[int, int]  # host page -> node
    evicted: Map[int, HostNode]  # host-only nodes
    evicted_children: Map[tuple[int, ChildKey], int]  # (parent, child key) -> host-only node

    def host_children(self, node_id: int) -> list[int]:
        """Host-only children of ``node_id`` (a scan; the host tree is small)."""
        return [child for (parent, _), child in self.evicted_children.items() if parent == node_id]


def empty_host_tier(num_pages: int) -> HostTier:
    if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages <= 0:
        raise ValueError(f"host num_pages must be a positive int, got {num_pages!r}")
    return HostTier(num_pages, FreeQueue.from_range(0, num_pages), Map(), Map(), Map(), Map())


@attrs.frozen
class SwaTier:
    """The sliding-window (SWA) KV pool beside the FULL pool (SGLang's hybrid SWA models).

    SWA pages are ``1..num_pages`` (page 0 is the padding page) with the FULL
    pool's page size.  Each is free (in ``free_pages``) or the *peer* of
    exactly one allocated FULL page: ``peer`` is SGLang's
    ``full_to_swa_index_mapping`` at page granularity (both pools page in
    step, so a FULL page's slots map to the same offsets of its peer).  A
    tree node's SWA component (``Node.swa``) is live exactly when its FULL
    pages have peers.  ``next_uuid`` numbers window-boundary receipts;
    ``evictable`` / ``protected`` are derived token counts of live SWA in the
    tree (unlocked / under a window lock), like the FULL counters.
    """

    num_pages: int
    free_pages: FreeQueue
    peer: Map[int, int]  # FULL page -> its SWA page
    next_uuid: int = 1
    evictable: int = 0  # derived: live, window-unlocked SWA tokens in the tree
    protected: int = 0  # derived: live, window-locked SWA tokens in the tree


def empty_swa_tier(num_pages: int, next_uuid: int = 1) -> SwaTier:
    if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages <= 0:
        raise ValueError(f"swa num_pages must be a positive int, got {num_pages!r}")
    return SwaTier(num_pages, FreeQueue.from_range(1, num_pages + 1), Map(), next_uuid)


class MambaNode(NamedTuple):
    """A tree node's Mamba component, in a cache with a Mamba pool (``MambaTier.nodes``).

    ``slot``: the Mamba state slot cached at the node's end (0: none; a node
    split off above a state, or one whose state was evicted, keeps its FULL
    KV without one).  ``lock_ref``: Mamba locks on the node itself (a request
    locks only the state it resumes from; never above the node's FULL
    ``lock_ref``).  ``stamp``: the state's place in the Mamba LRU (a logical
    time, unique among the tree's states; larger is more recent; 0 without a
    state).
    """

    slot: int = 0
    lock_ref: int = 0
    stamp: int = 0


@attrs.frozen
class MambaTier:
    """The Mamba state pool beside the FULL pool (SGLang's ``MambaPool`` / ``MambaSlotAllocator``).

    Slots are ``1..num_slots`` (slot 0 is the dummy padding slot).  Each is
    exactly one of: free (in ``free_slots``, queue order = reuse order: SGLang
    takes from the front and appends frees), held by a request row (``held``
    and the row's entries in ``rows``: ``(mamba_pool_idx, *ping-pong track
    slots)``, 0 for an empty entry), held DETACHED (between owners: a
    copy-on-match slot before its row exists, a checkpoint being inserted),
    or the state of one tree node (``nodes[node].slot``; ``slot_node`` is its
    reverse index).  ``nodes`` has an entry for every node with a state or a
    Mamba lock.  ``evictable`` / ``protected`` are derived counts of the
    tree's states (Mamba-unlocked / locked), SGLang's ``mamba_evictable_size``
    and ``mamba_protected_size``.
    """

    num_slots: int
    free_slots: FreeQueue
    held: Map[int, RequestId]  # slot -> the request row holding it, or DETACHED
    rows: Map[RequestId, tuple[int, ...]]  # row -> (main slot, *track slots); 0 = empty entry
    nodes: Map[int, MambaNode]  # tree node -> its Mamba component (a state or a lock)
    slot_node: Map[int, int] = attrs.field(factory=Map)  # derived: slot -> tree node
    evictable: int = 0  # derived: Mamba-unlocked states in the tree
    protected: int = 0  # derived: Mamba-locked states in the tree


def empty_mamba_tier(num_slots: int) -> MambaTier:
    if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots <= 0:
        raise ValueError(f"mamba num_slots must be a positive int, got {num_slots!r}")
    return MambaTier(num_slots, FreeQueue.from_range(1, num_slots + 1), Map(), Map(), Map())


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
    # Derived index (not in the fingerprint): unlocked childless nodes below the
    # root, kept by the radix-mode tree rules so eviction never scans.
    leaves: Map[int, None] = attrs.field(factory=Map)
    # Derived index (not in the fingerprint): for each tree page, how many request
    # tables map it without holding it (SGLang's locked prefix).  Such a page must
    # not leave the tree: evicting it would be a use after free.
    tree_refs: Map[int, int] = attrs.field(factory=Map)
    host: HostTier | None = None  # the host tier, when the cache has one
    swa: SwaTier | None = None  # the SWA pool, when the cache is a FULL + SWA hybrid
    mamba: MambaTier | None = None  # the Mamba pool, when the cache is a FULL + MAMBA hybrid
    _fingerprint: list[bytes] = attrs.field(factory=list, repr=False, alias="_fingerprint")

    # -- identity ---------------------------------------------------------
    def fingerprint(self) -> bytes:
        """128-bit blake2b of the canonical encoding (cached per state object)."""
        if not self._fingerprint:
            self._fingerprint.append(canonical.fingerprint(self))
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
        return refcount(self, page)

    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    def available_tokens(self) -> int:
        return len(self.free_pages) * self.geometry.page_size

    def slots_of(self, request_id: RequestId, start: int = 0, stop: int | None = None) -> list[int]:
        return slots_of(self, request_id, start, stop)

    def node_slots(self, node_id: int) -> list[int]:
        return list(expand_pages(self.nodes[node_id].pages, self.geometry.page_size))

    def path_to_root(self, node_id: int) -> Iterator[int]:
        return path_to_root(self.nodes, node_id)

    def is_leaf(self, node_id: int) -> bool:
        return len(self.nodes[node_id].children) == 0

    def with_changes(self, **changes: Any) -> State:
        """A new state with ``changes`` and a fresh fingerprint cache (no evolve: hot path)."""
        values = list(_FIELD_GETTER(self))
        for name, value in changes.items():
            values[_FIELD_INDEX[name]] = value
        return State(*values)


STATE_FIELDS = tuple(f.name for f in attrs.fields(State) if f.name != "_fingerprint")
_FIELD_GETTER = operator.attrgetter(*STATE_FIELDS)
_FIELD_INDEX = {name: index for index, name in enumerate(STATE_FIELDS)}


# -- readers shared by the frozen State and the LiveState -------------------------
def refcount(state: Any, page: int) -> int:
    """Number of holders of ``page``: requests, DETACHED, and (radix mode) the tree.

    In block mode the tree does not hold (vLLM's ``ref_cnt``: requests and
    pool-level references only).
    """
    held = len(state.holders.get(page, ()))
    if state.geometry.mode == "block":
        return held
    return held + (1 if page in state.page_node else 0)


def slots_of(state: Any, request_id: RequestId, start: int = 0, stop: int | None = None) -> list[int]:
    """Slots mapped for token positions ``[start, stop)`` of a request."""
    record = state.requests[request_id]
    end = record.allocated if stop is None else min(stop, record.allocated)
    return list(slot_span(record.pages, state.geometry.page_size, start, end))


def path_to_root(nodes: Any, node_id: int) -> Iterator[int]:
    """Node ids from ``node_id`` up to (excluding) the root."""
    while node_id != ROOT:
        yield node_id
        node_id = nodes[node_id].parent


def expand_pages(pages: Sequence[int], page_size: int) -> tuple[int, ...]:
    """Every slot of ``pages``, in order (``page * P + offset``)."""
    if page_size == 1:
        return tuple(pages)
    return tuple(chain.from_iterable(range(p * page_size, p * page_size + page_size) for p in pages))


def pages_of(slots: Sequence[int], page_size: int) -> list[int]:
    """The page of every ``page_size``-th slot: the pages of slots that follow whole pages
    (at page 1, the slots themselves, copied in C)."""
    if page_size == 1:
        return list(slots)
    return [slot // page_size for slot in slots[::page_size]]


def slot_span(pages: Sequence[int], page_size: int, start: int, stop: int) -> tuple[int, ...]:
    """Slots of token positions ``[start, stop)`` of a page table (positions from 0)."""
    if stop <= start:
        return ()
    first, last = start // page_size, -(-stop // page_size)
    offset = first * page_size
    return expand_pages(pages[first:last], page_size)[start - offset: stop - offset]


def initial_state(geometry: Geometry, *, host_pages: int = 0, swa_pages: int = 0,
                  mamba_slots: int = 0) -> State:
    """Everything free: pages 1..N in order, rows handed out from the top.

    O(1) memory whatever the geometry declares: the free lists are ranges.
    ``host_pages`` > 0 adds an empty host tier of that many pages;
    ``swa_pages`` > 0 an empty SWA pool (radix mode, no host tier);
    ``mamba_slots`` > 0 an empty Mamba pool (radix mode, no host tier).
    """
    if swa_pages and (host_pages or geometry.mode != "radix"):
        raise ValueError("an SWA pool needs radix mode and no host tier")
    if mamba_slots and (host_pages or geometry.mode != "radix"):
        raise ValueError("a Mamba pool needs radix mode and no host tier")
    root = Node(parent=-1, key=(), pages=(), children=Map(), lock_ref=1, last_access=0)
    return State(
        geometry=geometry,
        seq=0,
        clock=0,
        free_pages=FreeQueue.from_range(1, geometry.num_pages + 1),
        holders=Map(),
        page_node=Map(),
        free_rows=FreeQueue.from_range(1, geometry.num_rows + 1, desc=True),
        row_generation=Map(),
        requests=Map(),
        nodes=Map({ROOT: root}),
        next_node_id=1,
        evictable_size=0,
        protected_size=0,
        host=empty_host_tier(host_pages) if host_pages else None,
        swa=empty_swa_tier(swa_pages) if swa_pages else None,
        mamba=empty_mamba_tier(mamba_slots) if mamba_slots else None,
    )
