"""Canonical byte encoding of a state and its 128-bit fingerprint.

The encoding is msgpack of plain lists in a fixed field order, with every map
sorted, so two states are equal exactly when their encodings are.  It covers
what decides future behaviour (free-list order, holders, rows, tree, clock,
host tier) and leaves out history (``seq``), derived indexes (``leaves``,
``tree_refs``, ``below``) and representation details (range free lists).

It reads only attribute names shared by a frozen ``State`` and a live one,
so the live engine fingerprints itself without freezing.  The bytes are
streamed into the hash: a free list of millions of pages is never built as
one Python list.  Pure; imports nothing from the rest of kvstate.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any, Protocol

import msgpack

from kvstate.msgpack_raw import array_header

ENCODING_VERSION = 1
_CHUNK = 1 << 16


class _Sink(Protocol):
    def update(self, data: bytes, /) -> None: ...


def _id_order(request_id: int | str) -> tuple[int, Any]:
    return (1, request_id) if isinstance(request_id, str) else (0, request_id)


def _child_order(item: tuple[Any, int]) -> tuple[int, Any]:
    key = item[0]
    return (1, tuple(key)) if isinstance(key, tuple) else (0, key)


def _stream_ints(sink: _Sink, items: Iterable[int], length: int) -> None:
    """An msgpack array of ``length`` ints, packed chunk by chunk."""
    sink.update(array_header(length))
    iterator: Iterator[int] = iter(items)
    while True:
        chunk = list(islice(iterator, _CHUNK))
        if not chunk:
            return
        packed = msgpack.packb(chunk)
        sink.update(packed[len(array_header(len(chunk))):])


def _core_parts(state: Any) -> list[Any]:
    """Every core field but the two free lists, in encoding order (positions 1-2, 5-12)."""
    geometry = state.geometry
    holders = [[page, sorted(held, key=_id_order)] for page, held in sorted(state.holders.items())]
    requests = []
    for request_id, record in sorted(state.requests.items(), key=lambda kv: _id_order(kv[0])):
        entry = [request_id, list(record.pages), record.allocated, record.committed]
        if record.dangling:  # only SGLang-style frees under a live row add this
            entry.append(list(record.dangling))
        requests.append(entry)
    nodes = []
    for node_id, node in sorted(state.nodes.items()):
        children = [[list(k) if isinstance(k, tuple) else k, child]
                    for k, child in sorted(node.children.items(), key=_child_order)]
        entry = [node_id, node.parent, list(node.key), list(node.pages), children,
                 node.lock_ref, node.last_access]
        swa = getattr(node, "swa", None)
        if node.extra is not None or swa is not None:  # block mode or SWA pool only
            entry.append(node.extra)
        if swa is not None:  # a cache with an SWA pool: the node's SWA component
            entry.append([int(swa.live), swa.lock_ref, swa.uuid, swa.stamp])
        nodes.append(entry)
    shape: list[Any] = [geometry.num_pages, geometry.page_size, geometry.num_rows,
                        geometry.row_width]
    if geometry.mode != "radix":  # only non-default modes change the encoding
        shape.append(geometry.mode)
    return [shape, state.clock, holders, sorted(state.page_node.items()),
            sorted(state.row_generation.items()), requests, nodes, state.next_node_id,
            state.evictable_size, state.protected_size]


COMPONENTS = ("encoding_version", "geometry", "clock", "free_pages", "holders", "page_node",
              "free_rows", "row_generation", "requests", "nodes", "next_node_id",
              "evictable_size", "protected_size")


def components(state: Any) -> list[tuple[str, Any]]:
    """The canonical encoding's parts by name, as plain values (for describing differences);
    with a host tier, its parts follow as ``host.*``."""
    (shape, clock, holders, page_node, generations, requests, nodes, next_node_id,
     evictable, protected) = _core_parts(state)
    values = [ENCODING_VERSION, shape, clock, list(state.free_pages), holders, page_node,
              list(state.free_rows), generations, requests, nodes, next_node_id, evictable,
              protected]
    parts = list(zip(COMPONENTS, values, strict=True))
    host = getattr(state, "host", None)
    if host is not None:
        names = ("host.num_pages", "host.free_pages", "host.backup", "host.evicted",
                 "host.evicted_children")
        parts.extend(zip(names, host_canonical(host), strict=True))
    swa = getattr(state, "swa", None)
    if swa is not None:
        pool = ("swa.num_pages", "swa.free_pages", "swa.peer", "swa.next_uuid")
        parts.extend(zip(pool, swa_canonical(swa), strict=True))
    mamba = getattr(state, "mamba", None)
    if mamba is not None:
        names = ("mamba.num_slots", "mamba.free_slots", "mamba.held", "mamba.rows",
                 "mamba.nodes")
        parts.extend(zip(names, mamba_canonical(mamba), strict=True))
    return parts


def encode_core(state: Any, sink: _Sink) -> None:
    """Stream the core encoding (everything but the host tier) into ``sink``."""
    (shape, clock, holders, page_node, generations, requests, nodes, next_node_id,
     evictable, protected) = _core_parts(state)
    pack = msgpack.Packer(use_bin_type=True).pack
    sink.update(array_header(13))
    sink.update(pack(ENCODING_VERSION) + pack(shape) + pack(clock))
    _stream_ints(sink, state.free_pages, len(state.free_pages))
    sink.update(pack(holders) + pack(page_node))
    _stream_ints(sink, state.free_rows, len(state.free_rows))
    sink.update(pack(generations) + pack(requests) + pack(nodes) + pack(next_node_id)
                + pack(evictable) + pack(protected))


def host_canonical(host: Any) -> list[Any]:
    """The host tier as plain, deterministically ordered msgpack types."""
    def child(key: Any) -> Any:
        return list(key) if isinstance(key, tuple) else key

    return [
        host.num_pages,
        list(host.free_pages),
        [[n, list(p)] for n, p in sorted(host.backup.items())],
        [[n, h.parent, list(h.key), h.last_access] for n, h in sorted(host.evicted.items())],
        sorted([[p, child(k), n] for (p, k), n in host.evicted_children.items()],
               key=lambda item: (item[0], str(item[1]))),
    ]


def swa_canonical(swa: Any) -> list[Any]:
    """The SWA pool as plain msgpack types (its size counters are derived: left out)."""
    return [swa.num_pages, list(swa.free_pages), sorted(swa.peer.items()), swa.next_uuid]


def mamba_canonical(mamba: Any) -> list[Any]:
    """The Mamba pool as plain msgpack types (its reverse index and counters are derived)."""
    return [
        mamba.num_slots,
        list(mamba.free_slots),
        sorted([slot, holder] for slot, holder in mamba.held.items()),
        [[row, list(slots)] for row, slots in sorted(mamba.rows.items(),
                                                     key=lambda kv: _id_order(kv[0]))],
        [[n, m.slot, m.lock_ref, m.stamp] for n, m in sorted(mamba.nodes.items())],
    ]


class _Buffer:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def update(self, data: bytes) -> None:
        self.parts.append(data)


def encode(state: Any) -> bytes:
    """The canonical bytes of the core state (the host tier is hashed beside it)."""
    buffer = _Buffer()
    encode_core(state, buffer)
    return b"".join(buffer.parts)


def fingerprint(state: Any) -> bytes:
    """16-byte blake2b of :func:`encode` (with a host tier or an SWA pool: of that digest
    plus the tier's encoding).  Never Python's ``hash()``."""
    digest = hashlib.blake2b(digest_size=16)
    encode_core(state, digest)
    core = digest.digest()
    host = getattr(state, "host", None)
    if host is not None:
        tier = msgpack.packb(host_canonical(host), use_bin_type=True)
        core = hashlib.blake2b(core + tier, digest_size=16).digest()
    swa = getattr(state, "swa", None)
    if swa is not None:
        pool = msgpack.packb(swa_canonical(swa), use_bin_type=True)
        core = hashlib.blake2b(b"swa" + core + pool, digest_size=16).digest()
    mamba = getattr(state, "mamba", None)
    if mamba is not None:
        tier = msgpack.packb(mamba_canonical(mamba), use_bin_type=True)
        core = hashlib.blake2b(b"mamba" + core + tier, digest_size=16).digest()
    return core
