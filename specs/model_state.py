"""The reference model's state: plain dataclasses of dicts, sets and lists.

Owned by the spec (``specs/``).  Written from docs/design.md, docs/vllm.md,
the event docstrings and the named invariants, never from the rules' code.
Everything the rules keep incrementally (children indexes, the tree-page
owner, evictable and protected sizes, the host-only child index) the model
derives by scanning when it needs it.  The rule modules (``model_radix``,
``model_block``, ``model_host``) change a *clone*; ``specs.model.step``
makes it, so no rule ever changes its caller's model.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

DETACHED = 0
ROOT = 0
Holder = int | str


class ModelReject(Exception):
    """The event is not legal in this model state."""


@dataclass(slots=True)
class MRequest:
    """A request's table.  ``dangling``: sorted table indices whose page was freed under it."""

    pages: list[int]
    allocated: int = 0
    committed: int = 0
    dangling: list[int] = field(default_factory=list)

    def mapped(self) -> list[int]:
        """The pages the table really maps: every entry but the dangling ones."""
        gone = set(self.dangling)
        return [page for index, page in enumerate(self.pages) if index not in gone]


@dataclass(slots=True)
class MNode:
    """A tree node.  Block mode: ``key`` is one block, ``pages`` its copies (oldest first)."""

    parent: int
    key: tuple[int, ...]
    pages: list[int]
    lock_ref: int
    last_access: int
    extra: Any = None


@dataclass(slots=True)
class ModelHost:
    """The host tier: host pages ``0..num_pages-1``, backups, host-only nodes."""

    num_pages: int
    free: list[int]  # queue order, head first
    backup: dict[int, list[int]] = field(default_factory=dict)  # node -> host pages
    host_only: dict[int, tuple[int, tuple[int, ...], int]] = field(default_factory=dict)
    # host-only node -> (parent, key, last access)


@dataclass(slots=True)
class ModelState:
    num_pages: int
    page_size: int
    num_rows: int
    row_width: int
    mode: str = "radix"
    clock: int = 0
    next_node: int = 1
    free: list[int] = field(default_factory=list)  # queue order, head first
    holders: dict[int, set[Holder]] = field(default_factory=dict)  # non-tree holders
    free_rows: list[int] = field(default_factory=list)  # head first
    generation: dict[int, int] = field(default_factory=dict)
    requests: dict[Holder, MRequest] = field(default_factory=dict)
    nodes: dict[int, MNode] = field(default_factory=dict)
    pool: dict[int, int] = field(default_factory=dict)  # block mode: anonymous references
    host: ModelHost | None = None

    # -- derived views ---------------------------------------------------------
    def tree_page_owner(self) -> dict[int, int]:
        return {page: node_id for node_id, node in self.nodes.items() for page in node.pages}

    def children(self, node_id: int) -> list[int]:
        return sorted(n for n, node in self.nodes.items() if n != ROOT and node.parent == node_id)

    def child_key(self, key: tuple[int, ...], extra: Any = None) -> Any:
        if self.mode == "block":
            return (tuple(key), extra)
        return key[0] if self.page_size == 1 else tuple(key[: self.page_size])

    def path(self, node_id: int) -> list[int]:
        out = []
        while node_id != ROOT:
            out.append(node_id)
            node_id = self.nodes[node_id].parent
        return out

    def held(self, page: int) -> bool:
        """Held by someone outside the tree (a request, DETACHED, a pool reference)."""
        return page in self.holders or self.pool.get(page, 0) > 0

    def refcount(self, page: int) -> int:
        count = len(self.holders.get(page, ())) + self.pool.get(page, 0)
        if self.mode == "block":  # the tree holds nothing in block mode (vLLM ref_cnt)
            return count
        return count + int(any(page in n.pages for n in self.nodes.values()))


def clone(m: ModelState) -> ModelState:
    """A deep copy (plain containers only, so this is a few comprehensions)."""
    host = None
    if m.host is not None:
        h = m.host
        host = ModelHost(h.num_pages, list(h.free), {n: list(p) for n, p in h.backup.items()},
                         dict(h.host_only))
    return ModelState(
        m.num_pages, m.page_size, m.num_rows, m.row_width, m.mode, m.clock, m.next_node,
        list(m.free), {page: set(held) for page, held in m.holders.items()}, list(m.free_rows),
        dict(m.generation),
        {rid: MRequest(list(r.pages), r.allocated, r.committed, list(r.dangling))
         for rid, r in m.requests.items()},
        {nid: MNode(n.parent, n.key, list(n.pages), n.lock_ref, n.last_access, n.extra)
         for nid, n in m.nodes.items()},
        dict(m.pool), host,
    )


def initial_model(num_pages: int, page_size: int = 1, num_rows: int = 0,
                  row_width: int = 1 << 20, mode: str = "radix",
                  host_pages: int = 0) -> ModelState:
    host = ModelHost(host_pages, list(range(host_pages))) if host_pages else None
    return ModelState(
        num_pages=num_pages, page_size=page_size, num_rows=num_rows, row_width=row_width,
        mode=mode, free=list(range(1, num_pages + 1)), free_rows=list(range(num_rows, 0, -1)),
        nodes={ROOT: MNode(parent=-1, key=(), pages=[], lock_ref=1, last_access=0)},
        host=host,
    )


# -- helpers shared by the rule modules -------------------------------------------
def require(condition: bool, message: str) -> None:
    if not condition:
        raise ModelReject(message)


def valid_page(m: ModelState, page: int) -> None:
    require(1 <= page <= m.num_pages, f"page {page} is not in 1..{m.num_pages}")


def distinct(values: Iterable[Any], what: str) -> None:
    values = list(values)
    require(len(values) == len(set(values)), f"duplicate {what}")


def open_request(m: ModelState, request: Holder) -> MRequest:
    require(request in m.requests, f"request {request!r} is not open")
    return m.requests[request]


def no_earlier_than_clock(m: ModelState, time: int) -> None:
    require(time >= m.clock, f"time {time} is before the clock {m.clock}")


def drop_hold(m: ModelState, request: Holder, page: int) -> None:
    """The request lets go of ``page``.  A page then held by nobody stays allocated as
    DETACHED, unless the tree holds it (radix mode; in block mode the tree holds nothing,
    so it becomes one anonymous pool reference)."""
    held = m.holders.get(page)
    if held is None or request not in held:
        return  # a tree page the request only referenced
    held.discard(request)
    if held:
        return
    del m.holders[page]
    if m.mode == "block":
        if not m.pool.get(page):
            m.pool[page] = 1
    elif page not in m.tree_page_owner():
        m.holders[page] = {DETACHED}


def push(queue: list[int], items: list[int], at_head: bool) -> list[int]:
    """``items`` at the head (the first becomes the head) or the tail, in the given order."""
    return list(items) + queue if at_head else queue + list(items)
