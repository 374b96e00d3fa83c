"""The executor's index plans: ``IndexPlan``, the planner registry, slot helpers.

An ``IndexPlan`` is the plain index lists one event implies; who computes
them is :mod:`kvstate.executor.plan` (and the per-family ``plan_*`` modules,
which register here with ``plans``).  Pure: no torch, clock or randomness.

What the fields mean (slots are ``page * page_size + offset``)::

    copy_src / copy_dst   slot i of copy_src is copied to slot i of copy_dst (all layers)
    freed_slots           slots whose page went back to the free list (content now garbage)
    new_tokens            (request, position, slot): fresh table entries a forward pass writes
    linked_tokens         (request, position, slot): table entries that now read bytes
                          already in the pool (tree pages, shared pages, moved own pages)
    dangled_tokens        (request, position, slot): entries whose page ``FreeMapped`` freed
                          under the row; reading them is a use after free until rewritten
    truncated             (request, length): table cut to ``length`` positions
    opened / closed       requests opened / closed by this event
    inserted              (node, depth, slots): a new tree node and its first token's depth
    split                 (node, at, new_node): new_node took the node's first ``at`` tokens
    dropped_nodes         tree nodes that left the tree (device and host)
    host_out_src/_dst     device slot i is copied to host slot i (a backup; all layers)
    host_in_src/_dst      host slot i is copied to device slot i (a load-back)
    host_freed            host slots whose copy was dropped
    demoted_nodes         nodes whose device copy was evicted but stay host-only
    loaded_nodes          (node, slots): host-only nodes put back on the device
    nulled_tokens         (request, position, slot): block mode, table entries that now map
                          the null page 0 (slot = position % page_size); no live KV there
    cached_blocks         (node, depth, slots): block mode, a held page that became a cached
                          copy of tree node ``node`` whose first token is at ``depth``
    uncached_pages        block mode: pages that stopped being cached copies
    adopted               (node, depth, slots): a tree node's tokens now live at ``slots``,
                          whose KV its adopting owner wrote (``SwaAdopt``)

The SWA pool of a FULL + SWA hybrid (SWA pages pair with FULL pages; an SWA
slot is ``swa_page * page_size + offset``, the offset of its FULL slot)::

    swa_paired            (full page, swa page): pairings made (``SwaAlloc``, ``SwaRebind``)
    swa_unpaired          FULL pages that lost their SWA page (freed, evicted, moved, reset)
    swa_moved             (from page, to page): the SWA page of FULL page ``from``, with the
                          KV on it, now serves FULL page ``to`` (``SwaRebind``)
    swa_freed_slots       SWA slots back on the SWA free list (content now garbage)
    swa_copy_src / _dst   SWA slot i of src is copied to SWA slot i of dst (a ``Copy`` of
                          FULL pages that both have SWA pages)
    swa_live_nodes        tree nodes whose SWA component became live

The Mamba state pool of a FULL + MAMBA hybrid (one recurrent state per slot, slots
``1..num_slots``, slot 0 the dummy; rows closed by ``closed`` leave their slots DETACHED)::

    mamba_taken           slots taken off the Mamba free list, held DETACHED (``MambaAlloc``)
    mamba_bound           (row, entries): a row's running slot, then its track slots, 0 for an
                          empty entry (``MambaBind``)
    mamba_donated         (row, index, old slot, fresh slot): entry ``index`` (a track slot
                          holding a checkpoint) leaves the row DETACHED, ``fresh`` takes its place
    mamba_copy_src / _dst the state in slot i of src is copied into slot i of dst (``MambaCopy``)
    mamba_committed       (node, slot, position): tree node ``node`` takes the held slot as its
                          state, the state of the first ``position`` tokens (the node's end)
    mamba_freed           slots back on the Mamba free list (``MambaFree``, ``MambaEvict``,
                          ``Reset``): content now garbage, poisoned in debug mode
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from kvstate.events import Event
from kvstate.state import ROOT, RequestId, expand_pages

TokenRef = tuple[RequestId, int, int]  # (request, position, slot)


class IndexPlan(msgspec.Struct, frozen=True):
    """Plain index lists derived from one event (immutable; a msgspec struct: cheap to build)."""

    copy_src: tuple[int, ...] = ()
    copy_dst: tuple[int, ...] = ()
    freed_slots: tuple[int, ...] = ()
    new_tokens: tuple[TokenRef, ...] = ()
    linked_tokens: tuple[TokenRef, ...] = ()
    dangled_tokens: tuple[TokenRef, ...] = ()
    truncated: tuple[tuple[RequestId, int], ...] = ()
    opened: tuple[RequestId, ...] = ()
    closed: tuple[RequestId, ...] = ()
    inserted: tuple[tuple[int, int, tuple[int, ...]], ...] = ()
    split: tuple[tuple[int, int, int], ...] = ()
    dropped_nodes: tuple[int, ...] = ()
    host_out_src: tuple[int, ...] = ()
    host_out_dst: tuple[int, ...] = ()
    host_in_src: tuple[int, ...] = ()
    host_in_dst: tuple[int, ...] = ()
    host_freed: tuple[int, ...] = ()
    demoted_nodes: tuple[int, ...] = ()
    loaded_nodes: tuple[tuple[int, tuple[int, ...]], ...] = ()
    nulled_tokens: tuple[TokenRef, ...] = ()
    cached_blocks: tuple[tuple[int, int, tuple[int, ...]], ...] = ()
    uncached_pages: tuple[int, ...] = ()
    adopted: tuple[tuple[int, int, tuple[int, ...]], ...] = ()
    swa_paired: tuple[tuple[int, int], ...] = ()
    swa_unpaired: tuple[int, ...] = ()
    swa_moved: tuple[tuple[int, int], ...] = ()
    swa_freed_slots: tuple[int, ...] = ()
    swa_copy_src: tuple[int, ...] = ()
    swa_copy_dst: tuple[int, ...] = ()
    swa_live_nodes: tuple[int, ...] = ()
    mamba_taken: tuple[int, ...] = ()
    mamba_bound: tuple[tuple[RequestId, tuple[int, ...]], ...] = ()
    mamba_donated: tuple[tuple[RequestId, int, int, int], ...] = ()
    mamba_copy_src: tuple[int, ...] = ()
    mamba_copy_dst: tuple[int, ...] = ()
    mamba_committed: tuple[tuple[int, int, int], ...] = ()
    mamba_freed: tuple[int, ...] = ()

    @property
    def moves_bytes(self) -> bool:
        return bool(self.copy_src or self.freed_slots or self.host_out_src or self.host_in_src
                    or self.swa_freed_slots or self.swa_copy_src or self.mamba_copy_src
                    or self.mamba_freed)

    @property
    def touches_swa(self) -> bool:
        """Whether the plan changes the SWA pool's pairing, bytes or live nodes."""
        return bool(self.swa_paired or self.swa_unpaired or self.swa_freed_slots
                    or self.swa_copy_src or self.swa_live_nodes)

    @property
    def touches_mamba(self) -> bool:
        """Whether the plan changes the Mamba pool's owners or bytes."""
        return bool(self.mamba_taken or self.mamba_bound or self.mamba_donated
                    or self.mamba_copy_src or self.mamba_committed or self.mamba_freed)


EMPTY_PLAN = IndexPlan()
Planner = Callable[[Any, Any], IndexPlan]
PLANNERS: dict[type[Event], Planner] = {}


def plans(event_type: type[Event]) -> Callable[[Planner], Planner]:
    """Register the index planner of an event type (one per type)."""

    def register(fn: Planner) -> Planner:
        if event_type in PLANNERS:
            raise ValueError(f"{event_type.__name__} already has an index planner")
        PLANNERS[event_type] = fn
        return fn

    return register


class PageSlots(tuple[int, ...]):
    """The slots of whole ``pages`` in order: a plain tuple that also remembers its pages.

    Executors read ``pages`` to copy page by page without re-deriving them
    from the slots; everything else sees an ordinary immutable tuple.
    """

    pages: tuple[int, ...]
    page_size: int

    def __new__(cls, pages: Sequence[int], page_size: int) -> PageSlots:
        slots = super().__new__(cls, expand_pages(pages, page_size))
        slots.pages = tuple(pages)
        slots.page_size = page_size
        return slots


def page_slots(pages: Sequence[int], page_size: int) -> tuple[int, ...]:
    """Every slot of ``pages`` (a :class:`PageSlots`)."""
    return PageSlots(pages, page_size)


def node_depth(state: Any, node_id: int) -> int:
    """Tokens above ``node_id``'s first token (sum of its ancestors' key lengths)."""
    nodes = state.nodes
    depth = 0
    current = nodes[node_id].parent
    while current != ROOT:
        node = nodes[current]
        depth += len(node.key)
        current = node.parent
    return depth


def depth_below(state: Any, node_id: int) -> int:
    """Depth of a child of ``node_id``: tokens down to and including ``node_id``'s key."""
    if node_id == ROOT:
        return 0
    return node_depth(state, node_id) + len(state.nodes[node_id].key)
