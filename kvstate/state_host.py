"""The host tier's bookkeeping: where each tree node's KV lives besides the device.

A tree node is, at any time, one of::

    device only     in ``State.nodes``, not in ``HostTier.backup``
    device + host   in ``State.nodes`` and in ``backup`` (a host copy exists)
    host only       in ``HostTier.evicted`` and ``backup`` (device copy evicted;
                    the node keeps its id, parent and key, and can be loaded back)

Host pages are ``0..num_pages-1`` (no padding page on the host, as in
SGLang's ``HostKVCache``).  Host-only nodes are not in ``State.nodes`` (so
the device tree, its sizes and its walks keep their meaning); they hang off
their parent through ``evicted_children[(parent, child_key)]``.

``TieredState`` pairs an unchanged core ``State`` with a ``HostTier``; both
are immutable and its fingerprint covers both.  Everything here is pure.
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import attrs
import msgpack
from immutables import Map

from kvstate.freequeue import FreeQueue
from kvstate.state import ChildKey, State


class HostNode(NamedTuple):
    """A host-only node: its device copy was evicted, its key and place are kept."""

    parent: int
    key: tuple[int, ...]
    last_access: int


@attrs.frozen
class HostTier:
    num_pages: int
    free_pages: FreeQueue  # free host pages, reuse order
    backup: Map[int, tuple[int, ...]]  # node -> host pages holding its KV (page by page)
    owner: Map[int, int]  # host page -> node (each used host page has exactly one owner)
    evicted: Map[int, HostNode]  # host-only nodes
    evicted_children: Map[tuple[int, ChildKey], int]  # (parent, child key) -> host-only node

    def canonical(self) -> list[Any]:
        def child(key: ChildKey) -> Any:
            return list(key) if isinstance(key, tuple) else key

        return [
            self.num_pages,
            list(self.free_pages),
            [[n, list(p)] for n, p in sorted(self.backup.items())],
            [[n, h.parent, list(h.key), h.last_access] for n, h in sorted(self.evicted.items())],
        ] + [sorted([[p, child(k), n] for (p, k), n in self.evicted_children.items()],
                    key=lambda item: (item[0], str(item[1])))]

    def is_backed_up(self, node_id: int) -> bool:
        return node_id in self.backup

    def host_children(self, node_id: int) -> list[int]:
        """Host-only children of ``node_id`` (a scan; the host tree is small)."""
        return [child for (parent, _), child in self.evicted_children.items() if parent == node_id]


def empty_host_tier(num_pages: int) -> HostTier:
    if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages <= 0:
        raise ValueError(f"host num_pages must be a positive int, got {num_pages!r}")
    return HostTier(num_pages, FreeQueue.from_pages(range(num_pages)), Map(), Map(), Map(), Map())


@attrs.frozen(eq=False)
class TieredState:
    """A core state plus its host tier (immutable; equality goes by fingerprint)."""

    core: State
    host: HostTier

    def fingerprint(self) -> bytes:
        host = msgpack.packb(self.host.canonical(), use_bin_type=True)
        return hashlib.blake2b(self.core.fingerprint() + host, digest_size=16).digest()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TieredState):
            return NotImplemented
        return self is other or self.fingerprint() == other.fingerprint()

    def __hash__(self) -> int:
        return int.from_bytes(self.fingerprint()[:8], "little")

    def replace(self, core: State | None = None, host: HostTier | None = None) -> TieredState:
        return TieredState(self.core if core is None else core, self.host if host is None else host)


def tiered(state: State, host_pages: int) -> TieredState:
    """``state`` with an empty host tier of ``host_pages`` pages."""
    return TieredState(state, empty_host_tier(host_pages))
