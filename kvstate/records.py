"""The records a state is made of: tree nodes, request tables, host-only nodes.

Each record has a frozen form (``Node``, ``Request``: tuples, held by a
frozen ``State``) and a mutable form (``MNode``, ``MRequest``: mutable
structs, held by a ``LiveState`` and by a persistent transaction while it
edits a record).  Both forms have the same attribute names, so code that
only reads (invariants, encoding, the planner) takes either.  The rules write
only mutable records; ``thaw_*`` and ``freeze_*`` convert between the two.

A request's table maps position ``pos`` to slot ``pages[pos // P] * P + pos % P``.
``dangling`` lists table indices whose page was freed while the table still
mapped it (SGLang frees a request's duplicate or tail slots before it
rewrites or frees the row); reading such an entry is a use after free.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec
from immutables import Map

RequestId = int | str
ChildKey = int | tuple[Any, ...]


class Node(NamedTuple):
    """A radix-tree node (frozen).  ``pages`` back ``key`` page by page.

    ``below`` is derived (not in the fingerprint): the sum of the children's
    ``lock_ref``, so an unlock checks "holds a lock of its own" without
    walking every child of a shared system prompt.
    """

    parent: int
    key: tuple[int, ...]
    pages: tuple[int, ...]
    children: Map[ChildKey, int]
    lock_ref: int
    last_access: int
    extra: Any = None  # block mode: the block's tagged extra keys (part of its identity)
    below: int = 0
    swa: SwaNode | None = None  # caches with an SWA pool: every node but the root has one


class SwaNode(NamedTuple):
    """A tree node's sliding-window (SWA) component, in a cache with an SWA pool.

    ``live``: the node's SWA KV is on the device (its FULL pages have SWA
    peers, ``State.swa.peer``); a *tombstone* (``live=False``) keeps its FULL
    KV but lost its SWA KV.  ``lock_ref``: SWA window locks covering the node
    (never above the node's FULL ``lock_ref``).  ``uuid``: the window-boundary
    receipt stamped on the node where a window lock stopped (0: none).
    ``stamp``: the node's place in the SWA LRU (a logical time; larger is more
    recent, and among equal stamps, which lie on one root path, the deeper
    node is the more recent; 0 on a tombstone).
    """

    live: bool = False
    lock_ref: int = 0
    uuid: int = 0
    stamp: int = 0


class Request(NamedTuple):
    """A request's table (frozen): ``allocated`` tokens mapped through ``pages``."""

    pages: tuple[int, ...] = ()
    allocated: int = 0
    committed: int = 0
    dangling: tuple[int, ...] = ()  # sorted table indices whose page was freed under it


class HostNode(NamedTuple):
    """A host-only node: its device copy was evicted, its key and place are kept."""

    parent: int
    key: tuple[int, ...]
    last_access: int


# The mutable records are msgspec structs the cyclic collector does not track (``gc=False``):
# a live tree holds one ``MNode`` per node, and tracking them only made young collections
# more frequent.  They cannot be part of a cycle: a record refers to ids, tuples and its own
# children map, never to another record.  ``eq=False`` keeps identity comparison.
class MNode(msgspec.Struct, gc=False, eq=False):
    """A tree node being edited (fields as ``Node``; ``children`` is a mutable mapping)."""

    parent: int
    key: tuple[int, ...]
    pages: tuple[int, ...]
    children: Any
    lock_ref: int
    last_access: int
    extra: Any = None
    below: int = 0
    swa: SwaNode | None = None


class MRequest(msgspec.Struct, gc=False, eq=False):
    """A request table being edited (fields as ``Request``; ``pages`` is a list)."""

    pages: list[int]
    allocated: int = 0
    committed: int = 0
    dangling: tuple[int, ...] = ()


def freeze_node(node: MNode | Node) -> Node:
    if isinstance(node, Node):
        return node
    children = node.children
    if not isinstance(children, Map):
        children = children.finish() if hasattr(children, "finish") else Map(children)
    return Node(node.parent, node.key, node.pages, children, node.lock_ref, node.last_access,
                node.extra, node.below, node.swa)


def freeze_request(record: MRequest | Request) -> Request:
    if isinstance(record, Request):
        return record
    return Request(tuple(record.pages), record.allocated, record.committed, record.dangling)


def thaw_request(record: Request | MRequest) -> MRequest:
    return MRequest(list(record.pages), record.allocated, record.committed, record.dangling)
