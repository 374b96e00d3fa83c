"""What each event *names*: the pages, requests, nodes and host copies it may change.

Spelled out per event kind from the event docstrings, as tables keyed by the
event's type (one lookup per edge).  ``None`` means "all of them" (a reset,
a cache clear).  ``specs.transitions`` (T1 ``frame``, T3 ``free_isolation``)
holds the rules to these sets.  Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from kvstate import events as ev
from kvstate.state import DETACHED, ROOT

Names = Callable[[Any, Any], "set[Any] | None"]
_NONE: set[Any] = set()


def _slot_pages(slots: Iterable[int], size: int) -> set[int]:
    return {slot // size for slot in slots}


def _sole_holders(state: Any, pages: Iterable[int]) -> set[Any]:
    return {held[0] for p in pages if len(held := state.holders.get(p, ())) == 1
            and held != (DETACHED,)}


def path(state: Any, node_id: int) -> list[int]:
    """Node ids from ``node_id`` up to (excluding) the root."""
    out = []
    while node_id != ROOT:
        out.append(node_id)
        node_id = state.nodes[node_id].parent
    return out


def _table(state: Any, request: Any) -> set[int]:
    return set(state.requests[request].pages)


def _reset_rows(s: Any, e: Any) -> set[Any] | None:
    return None if e.scope in ("rows", "all") else set()


def _reset_tree(s: Any, e: Any) -> set[Any] | None:
    return None if e.scope in ("tree", "all") else set()


_REQUESTS: dict[type, Names] = {
    ev.ReqAlloc: lambda s, e: set(e.requests),
    ev.ReqFree: lambda s, e: set(e.requests),
    ev.Allocate: lambda s, e: {rid for rid, _ in e.items},
    ev.Append: lambda s, e: {rid for rid, _ in e.items},
    ev.Assign: lambda s, e: {e.request},
    ev.Share: lambda s, e: {e.request},
    ev.Truncate: lambda s, e: {e.request},
    ev.Scatter: lambda s, e: {rid for rid, _, _ in e.items},
    ev.FreeMapped: lambda s, e: _sole_holders(s, e.pages),  # their entries become dangling
    ev.BlockAlloc: lambda s, e: {e.holder},
    ev.BlockHold: lambda s, e: {e.holder},
    ev.BlockRelease: lambda s, e: {e.holder},
    ev.Reset: _reset_rows,
}

_PAGES: dict[type, Names] = {
    ev.Allocate: lambda s, e: set(e.pages) | {x // s.geometry.page_size
                                              for _, slots in e.items for x in slots},
    ev.Free: lambda s, e: set(e.pages),
    ev.FreeMapped: lambda s, e: set(e.pages),
    ev.BlockUncache: lambda s, e: set(e.pages),
    ev.Load: lambda s, e: set(e.pages),
    ev.Share: lambda s, e: _slot_pages(e.slots, s.geometry.page_size),
    ev.Insert: lambda s, e: _slot_pages(e.slots, s.geometry.page_size),
    ev.Assign: lambda s, e: _slot_pages(e.slots, s.geometry.page_size) | _table(s, e.request),
    ev.Scatter: lambda s, e: ({x // s.geometry.page_size for _, _, x in e.items}
                              | {p for rid, _, _ in e.items for p in s.requests[rid].pages}),
    ev.Truncate: lambda s, e: _table(s, e.request),
    ev.ReqFree: lambda s, e: {p for rid in e.requests for p in s.requests[rid].pages},
    ev.Split: lambda s, e: set(s.nodes[e.node].pages),
    ev.Evict: lambda s, e: {p for n in e.nodes if n in s.nodes for p in s.nodes[n].pages},
    ev.BlockAlloc: lambda s, e: set(e.pages) - {0},
    ev.BlockHold: lambda s, e: set(e.pages) - {0},
    ev.BlockRelease: lambda s, e: set(e.pages) - {0},
    ev.BlockCache: lambda s, e: {entry[3] for entry in e.entries} - {0},
    ev.Reset: lambda s, e: None,
    ev.BlockClear: lambda s, e: None,
}


def _load_nodes(s: Any, e: Any) -> set[int]:
    record = s.host.evicted.get(e.node)
    return {e.node} | ({record.parent} if record is not None else set())


_NODES: dict[type, Names] = {
    ev.Insert: lambda s, e: {e.parent, e.node},
    ev.Split: lambda s, e: {e.node, e.new_node, s.nodes[e.node].parent},
    ev.Touch: lambda s, e: set(e.nodes),
    ev.Lock: lambda s, e: set(path(s, e.node)),
    ev.Unlock: lambda s, e: set(path(s, e.node)),
    ev.Evict: lambda s, e: set(e.nodes) | {s.nodes[n].parent for n in e.nodes if n in s.nodes},
    ev.BlockCache: lambda s, e: {e.parent} | {entry[0] for entry in e.entries},
    # emptied nodes go, and so may their ancestors (pruning)
    ev.BlockUncache: lambda s, e: {ROOT} | {a for n in e.nodes if n in s.nodes for a in path(s, n)},
    ev.Load: _load_nodes,
    ev.BlockClear: lambda s, e: None,
    ev.Reset: _reset_tree,
}

def _window(s: Any, e: Any) -> set[int]:
    """An SWA window lock's nodes: ``e.node`` up to ``e.top`` (the root: the whole path)."""
    nodes = path(s, e.node) if e.node in s.nodes else []
    return set(nodes[: nodes.index(e.top) + 1] if e.top in nodes else nodes)


def _receipt_window(s: Any, e: Any) -> set[int]:
    """An SWA unlock's nodes: ``e.node`` up to the node carrying receipt ``e.uuid``."""
    nodes = path(s, e.node) if e.node in s.nodes else []
    ends = [i for i, n in enumerate(nodes) if e.uuid and s.nodes[n].swa.uuid == e.uuid]
    return set(nodes[: ends[0] + 1] if ends else nodes)


# The SWA events change nodes' SWA components (and an adoption the node's FULL pages); the
# Mamba events change only the Mamba pool, no node, page or request of the core.
_NODES.update({
    ev.SwaEvict: lambda s, e: set(e.nodes),
    ev.SwaPublish: lambda s, e: {e.node},
    ev.SwaTouch: lambda s, e: set(e.nodes),
    ev.SwaLock: _window,
    ev.SwaUnlock: _receipt_window,
    ev.SwaAdopt: lambda s, e: {e.node},
    ev.SwaRebind: lambda s, e: {e.node},
})
_PAGES[ev.SwaAdopt] = lambda s, e: set(e.pages) | set(s.nodes[e.node].pages)

_HOST_NODES: dict[type, Names] = {
    ev.Offload: lambda s, e: {e.node},
    ev.Load: lambda s, e: {e.node},
    ev.HostFree: lambda s, e: set(e.nodes),
    ev.Evict: lambda s, e: set(e.nodes),
    ev.Split: lambda s, e: {e.node, e.new_node},
    ev.Reset: _reset_tree,
}


def _lookup(table: dict[type, Names], state: Any, event: ev.Event) -> set[Any] | None:
    names = table.get(type(event))
    return set() if names is None else names(state, event)


def named_requests(state: Any, event: ev.Event) -> set[Any] | None:
    """Requests an event names (``None``: all of them)."""
    return _lookup(_REQUESTS, state, event)


def named_pages(state: Any, event: ev.Event) -> set[int] | None:
    return _lookup(_PAGES, state, event)


def named_nodes(state: Any, event: ev.Event) -> set[int] | None:
    return _lookup(_NODES, state, event)


def named_host_nodes(state: Any, event: ev.Event) -> set[int] | None:
    """Nodes whose host copy or host-only record an event may change (``None``: all)."""
    return _lookup(_HOST_NODES, state, event)
