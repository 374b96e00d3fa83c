"""Canonical byte encoding of a ``State`` and its 128-bit fingerprint.

The encoding is msgpack of plain lists in a fixed field order, with every map
sorted, so two states are equal exactly when their encodings are.  It covers
what decides future behaviour (free-list order, holders, rows, tree, clock)
and leaves out history (``seq``) and representation details (the free
queue's internal keys).  Pure: reads the state, never changes it.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack

from kvstate.state import State

ENCODING_VERSION = 1


def _id_order(request_id: int | str) -> tuple[int, Any]:
    return (1, request_id) if isinstance(request_id, str) else (0, request_id)


def _child_order(item: tuple[Any, int]) -> tuple[int, Any]:
    key = item[0]
    return (1, tuple(key)) if isinstance(key, tuple) else (0, key)


def canonical(state: State) -> list[Any]:
    """The state as plain, deterministically ordered msgpack types."""
    geometry = state.geometry
    holders = [
        [page, sorted(held, key=_id_order)] for page, held in sorted(state.holders.items())
    ]
    requests = [
        [request_id, list(record.pages), record.allocated, record.committed]
        for request_id, record in sorted(state.requests.items(), key=lambda kv: _id_order(kv[0]))
    ]
    nodes = []
    for node_id, node in sorted(state.nodes.items()):
        children = [[list(k) if isinstance(k, tuple) else k, child]
                    for k, child in sorted(node.children.items(), key=_child_order)]
        entry = [node_id, node.parent, list(node.key), list(node.pages), children,
                 node.lock_ref, node.last_access]
        if node.extra is not None:  # block mode only; radix encodings stay as they were
            entry.append(node.extra)
        nodes.append(entry)
    shape: list[Any] = [geometry.num_pages, geometry.page_size, geometry.num_rows,
                        geometry.row_width]
    if geometry.mode != "radix":  # only non-default modes change the encoding
        shape.append(geometry.mode)
    return [
        ENCODING_VERSION,
        shape,
        state.clock,
        list(state.free_pages),
        holders,
        sorted(state.page_node.items()),
        list(state.free_rows),
        sorted(state.row_generation.items()),
        requests,
        nodes,
        state.next_node_id,
        state.evictable_size,
        state.protected_size,
    ]


def encode(state: State) -> bytes:
    return msgpack.packb(canonical(state), use_bin_type=True)


def fingerprint(state: State) -> bytes:
    """16-byte blake2b digest of :func:`encode`.  Never Python's ``hash()``."""
    return hashlib.blake2b(encode(state), digest_size=16).digest()
