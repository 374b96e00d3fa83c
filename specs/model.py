"""Reference model of the kvstate core: plain dicts, sets and lists.

Written from docs/design.md and the event docstrings, not from the reducer.
It favours obviousness over speed: every event copies the whole model, checks
every precondition by scanning, and derives what the reducer keeps
incrementally (children, tree pages, evictable and protected sizes).

``step(model, event)`` returns a new ``ModelState`` or raises ``ModelReject``.
The model never mutates its input.

Decisions where the design text leaves room (each one is a property in SPEC.md):

* a request's table never maps one page at two page indices (two positions
  would share a slot);
* a token is only ever appended into a partial page the request holds alone
  (writing into a page someone else also maps corrupts their KV);
* ``Unlock(n)`` releases a lock taken by ``Lock(n)``: ``n`` must hold a lock of
  its own (``lock_ref(n)`` minus its children's), else the path would be
  left with a child locked more than its parent;
* a tree page a request maps without holding it must stay in the tree while
  the request is open: ``Evict`` and ``Reset("tree")`` refuse to drop it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

DETACHED = 0
ROOT = 0
Holder = int | str


class ModelReject(Exception):
    """The event is not legal in this model state."""


@dataclass
class MRequest:
    pages: list[int]
    allocated: int = 0
    committed: int = 0


@dataclass
class MNode:
    parent: int
    key: tuple[int, ...]
    pages: list[int]
    lock_ref: int
    last_access: int


@dataclass
class ModelState:
    num_pages: int
    page_size: int
    num_rows: int
    row_width: int
    clock: int = 0
    next_node: int = 1
    free: list[int] = field(default_factory=list)  # queue order, head first
    holders: dict[int, set[Holder]] = field(default_factory=dict)  # non-tree holders
    free_rows: list[int] = field(default_factory=list)  # head first
    generation: dict[int, int] = field(default_factory=dict)
    requests: dict[Holder, MRequest] = field(default_factory=dict)
    nodes: dict[int, MNode] = field(default_factory=dict)

    # -- derived views ---------------------------------------------------------
    def tree_page_owner(self) -> dict[int, int]:
        return {page: node_id for node_id, node in self.nodes.items() for page in node.pages}

    def children(self, node_id: int) -> list[int]:
        return sorted(n for n, node in self.nodes.items() if n != ROOT and node.parent == node_id)

    def child_key(self, key: tuple[int, ...]) -> Any:
        return key[0] if self.page_size == 1 else tuple(key[: self.page_size])

    def path(self, node_id: int) -> list[int]:
        out = []
        while node_id != ROOT:
            out.append(node_id)
            node_id = self.nodes[node_id].parent
        return out

    def sizes(self) -> tuple[int, int]:
        """(evictable, protected) tokens, recomputed from the nodes."""
        evictable = sum(len(n.key) for i, n in self.nodes.items() if i != ROOT and n.lock_ref == 0)
        protected = sum(len(n.key) for i, n in self.nodes.items() if i != ROOT and n.lock_ref > 0)
        return evictable, protected

    def refcount(self, page: int) -> int:
        in_tree = any(page in n.pages for n in self.nodes.values())
        return len(self.holders.get(page, ())) + int(in_tree)


def clone(m: ModelState) -> ModelState:
    """A deep copy (plain containers only, so this is a few comprehensions)."""
    return ModelState(
        m.num_pages, m.page_size, m.num_rows, m.row_width, m.clock, m.next_node, list(m.free),
        {page: set(held) for page, held in m.holders.items()}, list(m.free_rows),
        dict(m.generation),
        {rid: MRequest(list(r.pages), r.allocated, r.committed) for rid, r in m.requests.items()},
        {nid: MNode(n.parent, n.key, list(n.pages), n.lock_ref, n.last_access)
         for nid, n in m.nodes.items()},
    )


def initial_model(num_pages: int, page_size: int = 1, num_rows: int = 0,
                  row_width: int = 1 << 20) -> ModelState:
    return ModelState(
        num_pages=num_pages, page_size=page_size, num_rows=num_rows, row_width=row_width,
        free=list(range(1, num_pages + 1)), free_rows=list(range(num_rows, 0, -1)),
        nodes={ROOT: MNode(parent=-1, key=(), pages=[], lock_ref=1, last_access=0)},
    )


# -- helpers -------------------------------------------------------------------
def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ModelReject(message)


def _valid_page(m: ModelState, page: int) -> None:
    _require(1 <= page <= m.num_pages, f"page {page} is not in 1..{m.num_pages}")


def _distinct(values: Iterable[Any], what: str) -> None:
    values = list(values)
    _require(len(values) == len(set(values)), f"duplicate {what}")


def _open(m: ModelState, request: Holder) -> MRequest:
    _require(request in m.requests, f"request {request!r} is not open")
    return m.requests[request]


def _drop_hold(m: ModelState, request: Holder, page: int) -> None:
    """The request lets go of ``page``; a page nobody holds any more stays allocated (DETACHED)."""
    held = m.holders.get(page)
    if held is None or request not in held:
        return  # a tree page the request only referenced
    held.discard(request)
    if held:
        return
    del m.holders[page]
    if page not in m.tree_page_owner():
        m.holders[page] = {DETACHED}


def _time(m: ModelState, time: int) -> None:
    _require(time >= m.clock, f"time {time} is before the clock {m.clock}")


def _referenced_tree_pages(m: ModelState) -> set[int]:
    """Tree pages some open request maps without holding them."""
    owner = m.tree_page_owner()
    return {page for rid, req in m.requests.items() for page in req.pages
            if page in owner and rid not in m.holders.get(page, ())}


def _table_is_injective(pages: list[int]) -> None:
    _require(len(pages) == len(set(pages)), "one page at two page indices of a table (slot collision)")


# -- rules -----------------------------------------------------------------------
def _req_alloc(m: ModelState, e: Any) -> None:
    _distinct(e.requests, "request")
    for rid in e.requests:
        if isinstance(rid, str):
            _require(rid not in m.requests, f"{rid!r} already open")
        else:
            _require(1 <= rid <= m.num_rows, f"row {rid} not in 1..{m.num_rows}")
            _require(rid in m.free_rows, f"row {rid} is taken")
    for rid in e.requests:
        m.requests[rid] = MRequest([])
        if isinstance(rid, int):
            m.free_rows.remove(rid)
            m.generation[rid] = m.generation.get(rid, 0) + 1


def _close(m: ModelState, requests: Iterable[Holder]) -> None:
    for rid in requests:
        for page in m.requests[rid].pages:
            _drop_hold(m, rid, page)
    for rid in requests:
        del m.requests[rid]


def _req_free(m: ModelState, e: Any) -> None:
    _distinct(e.requests, "request")
    for rid in e.requests:
        _open(m, rid)
    _close(m, e.requests)
    rows = [r for r in e.requests if isinstance(r, int)]
    m.free_rows = list(reversed(rows)) + m.free_rows


def _allocate(m: ModelState, e: Any) -> None:
    _distinct(e.pages, "page")
    for page in e.pages:
        _require(page in m.free, f"page {page} is not free")
    for page in e.pages:
        m.free.remove(page)
    if not e.items:
        for page in e.pages:
            m.holders[page] = {DETACHED}
        return
    size = m.page_size
    unused = list(e.pages)
    for rid, slots in e.items:
        req = _open(m, rid)
        _require(req.allocated + len(slots) <= m.row_width, "past the row width")
        for slot in slots:
            page, offset = divmod(slot, size)
            position = req.allocated
            _require(offset == position % size, f"slot {slot} breaks slot % P == pos % P")
            if offset == 0:
                _require(page in unused, f"page {page} is not a fresh page of this event")
                unused.remove(page)
                m.holders[page] = {rid}
                req.pages.append(page)
            else:
                _require(req.pages[-1] == page, f"slot {slot} is not in the partial page")
                _require(m.holders.get(page) == {rid} and page not in m.tree_page_owner(),
                         f"partial page {page} is not {rid!r}'s alone")
            req.allocated += 1
    _require(not unused, f"pages {unused} allocated but never mapped")


def _append(m: ModelState, e: Any) -> None:
    _distinct([rid for rid, _ in e.items], "request")
    for rid, committed in e.items:
        req = _open(m, rid)
        _require(req.committed <= committed <= req.allocated, f"commit {committed} out of range")
        req.committed = committed


def _assign(m: ModelState, e: Any) -> None:
    req = _open(m, e.request)
    size, start, stop = m.page_size, e.start, e.start + len(e.slots)
    _require(0 <= start <= req.allocated, f"write at {start} leaves a gap")
    _require(stop <= m.row_width, "past the row width")
    allocated = max(req.allocated, stop)
    pages = list(req.pages)
    written: dict[int, int] = {}
    for position, slot in zip(range(start, stop), e.slots, strict=True):
        page, offset = divmod(slot, size)
        _require(offset == position % size, f"slot {slot} breaks slot % P == pos % P")
        _valid_page(m, page)
        index = position // size
        _require(written.setdefault(index, page) == page, f"page index {index} gets two pages")
        if index < len(pages):
            whole = start <= index * size and min(index * size + size, allocated) <= stop
            _require(pages[index] == page or whole, f"page index {index} would be split")
            pages[index] = page
        else:
            pages.append(page)
    _table_is_injective(pages)
    owner = m.tree_page_owner()
    for page in pages:
        if page in req.pages or page in owner:
            continue
        _require(m.holders.get(page) == {DETACHED}, f"page {page} is not DETACHED")
        m.holders[page] = {e.request}
    for page in req.pages:
        if page not in pages:
            _drop_hold(m, e.request, page)
    req.pages, req.allocated = pages, allocated
    req.committed = min(req.committed, allocated)


def _share(m: ModelState, e: Any) -> None:
    req = _open(m, e.request)
    size = m.page_size
    _require(e.start == req.allocated and e.start % size == 0, "share must start at the aligned end")
    _require(e.start + len(e.slots) <= m.row_width, "past the row width")
    pages: list[int] = []
    for position, slot in zip(range(e.start, e.start + len(e.slots)), e.slots, strict=True):
        page, offset = divmod(slot, size)
        _require(offset == position % size, f"slot {slot} breaks slot % P == pos % P")
        if offset == 0:
            pages.append(page)
        else:
            _require(bool(pages) and pages[-1] == page, f"slot {slot} leaves the shared page")
    _distinct(pages, "page")
    owner = m.tree_page_owner()
    for page in pages:
        held = m.holders.get(page, set())
        _require(page in owner or bool(held), f"page {page} is free")
        _require(held != {DETACHED}, f"page {page} is DETACHED")
        _require(e.request not in held, f"page {page} already held")
    _table_is_injective(req.pages + pages)
    for page in pages:
        m.holders.setdefault(page, set()).add(e.request)
    req.pages.extend(pages)
    req.allocated += len(e.slots)


def _truncate(m: ModelState, e: Any) -> None:
    req = _open(m, e.request)
    _require(0 <= e.length <= req.allocated, "truncate out of range")
    keep = -(-e.length // m.page_size)
    for page in req.pages[keep:]:
        _drop_hold(m, e.request, page)
    req.pages = req.pages[:keep]
    req.allocated = e.length
    req.committed = min(req.committed, e.length)


def _free(m: ModelState, e: Any) -> None:
    _distinct(e.pages, "page")
    owner = m.tree_page_owner()
    for page in e.pages:
        _valid_page(m, page)
        _require(page not in owner, f"page {page} is a tree page")
        _require(m.holders.get(page) == {DETACHED}, f"page {page} is not DETACHED")
    for page in e.pages:
        del m.holders[page]
    m.free = list(e.pages) + m.free if e.at_head else m.free + list(e.pages)


def _copy(m: ModelState, e: Any) -> None:
    _require(len(e.src_pages) == len(e.dst_pages), "copy needs as many destinations as sources")
    _distinct(e.dst_pages, "destination page")
    owner = m.tree_page_owner()
    for page in e.src_pages:
        _valid_page(m, page)
        _require(page in owner or page in m.holders, f"copy source {page} is free")
    for page in e.dst_pages:
        _valid_page(m, page)
        _require(m.holders.get(page) == {DETACHED}, f"copy destination {page} is not DETACHED")
    _require(not set(e.src_pages) & set(e.dst_pages), "copy source and destination overlap")


def _insert(m: ModelState, e: Any) -> None:
    size = m.page_size
    _require(e.parent in m.nodes, f"unknown parent {e.parent}")
    _require(e.node == m.next_node, f"node id must be {m.next_node}")
    _time(m, e.time)
    _require(len(e.key) > 0 and len(e.key) == len(e.slots), "key and value lengths")
    _require(len(e.key) % size == 0, "key is not whole pages")
    first = m.child_key(e.key)
    _require(all(m.child_key(m.nodes[c].key) != first for c in m.children(e.parent)),
             "parent already has a child with that first page")
    pages = []
    for index in range(0, len(e.slots), size):
        page = e.slots[index] // size
        _require(list(e.slots[index:index + size]) == [page * size + k for k in range(size)],
                 "value is not whole pages")
        pages.append(page)
    _distinct(pages, "page")
    owner = m.tree_page_owner()
    for page in pages:
        _valid_page(m, page)
        _require(page not in owner, f"page {page} already in the tree")
        _require(e.owner in m.holders.get(page, ()), f"page {page} not held by {e.owner!r}")
    for page in pages:
        m.holders[page].discard(e.owner)
        if not m.holders[page]:
            del m.holders[page]
    m.nodes[e.node] = MNode(e.parent, tuple(e.key), pages, 0, e.time)
    m.next_node, m.clock = e.node + 1, e.time


def _split(m: ModelState, e: Any) -> None:
    size = m.page_size
    _require(e.node != ROOT and e.node in m.nodes, f"cannot split node {e.node}")
    _require(e.new_node == m.next_node, f"node id must be {m.next_node}")
    _time(m, e.time)
    node = m.nodes[e.node]
    _require(0 < e.at < len(node.key) and e.at % size == 0, f"bad split point {e.at}")
    cut = e.at // size
    m.nodes[e.new_node] = MNode(node.parent, node.key[:e.at], node.pages[:cut], node.lock_ref, e.time)
    m.nodes[e.node] = MNode(e.new_node, node.key[e.at:], node.pages[cut:], node.lock_ref,
                            node.last_access)
    m.next_node, m.clock = e.new_node + 1, e.time


def _touch(m: ModelState, e: Any) -> None:
    _time(m, e.time)
    for node_id in e.nodes:
        _require(node_id in m.nodes, f"unknown node {node_id}")
    for node_id in e.nodes:
        m.nodes[node_id].last_access = e.time
    m.clock = e.time


def _lock(m: ModelState, e: Any) -> None:
    _require(e.node in m.nodes, f"unknown node {e.node}")
    for node_id in m.path(e.node):
        m.nodes[node_id].lock_ref += 1


def _unlock(m: ModelState, e: Any) -> None:
    _require(e.node in m.nodes, f"unknown node {e.node}")
    if e.node == ROOT:
        return  # like Lock(ROOT): the root is locked once, forever; nothing moves
    below = sum(m.nodes[c].lock_ref for c in m.children(e.node))
    _require(m.nodes[e.node].lock_ref - below > 0,
             f"node {e.node} holds no lock of its own (its locks belong to its descendants)")
    for node_id in m.path(e.node):
        _require(m.nodes[node_id].lock_ref > 0, f"unlock of node {node_id} below zero")
        m.nodes[node_id].lock_ref -= 1


def _evict(m: ModelState, e: Any) -> None:
    _distinct(e.nodes, "node")
    referenced = _referenced_tree_pages(m)
    for node_id in e.nodes:
        _require(node_id != ROOT and node_id in m.nodes, f"cannot evict node {node_id}")
        node = m.nodes[node_id]
        _require(node.lock_ref == 0, f"node {node_id} is locked")
        _require(not m.children(node_id), f"node {node_id} is not a leaf")
        _require(not referenced & set(node.pages), f"node {node_id} pages are mapped by a request")
        del m.nodes[node_id]
        released = [p for p in node.pages if p not in m.holders]
        m.free = released + m.free if e.at_head else m.free + released


def _reset(m: ModelState, e: Any) -> None:
    _require(e.scope in ("tree", "rows", "pages", "all"), f"unknown reset scope {e.scope!r}")
    if e.scope in ("rows", "all"):
        _close(m, list(m.requests))
        m.free_rows = list(range(m.num_rows, 0, -1))
    if e.scope in ("tree", "all"):
        _require(not _referenced_tree_pages(m), "a request still maps tree pages it does not hold")
        owner = m.tree_page_owner()
        m.free = m.free + sorted(p for p in owner if p not in m.holders)
        root = m.nodes[ROOT]
        m.nodes = {ROOT: MNode(-1, (), [], 1, root.last_access)}
    if e.scope in ("pages", "all"):
        _require(len(m.nodes) == 1, "the tree still holds pages")
        _require(not m.requests, "requests are still open")
        m.free = list(range(1, m.num_pages + 1))
        m.holders = {}


RULES: dict[str, Callable[[ModelState, Any], None]] = {
    "ReqAlloc": _req_alloc, "ReqFree": _req_free, "Allocate": _allocate, "Append": _append,
    "Assign": _assign, "Share": _share, "Truncate": _truncate, "Free": _free, "Copy": _copy,
    "Insert": _insert, "Split": _split, "Touch": _touch, "Lock": _lock, "Unlock": _unlock,
    "Evict": _evict, "Reset": _reset,
}


def step(m: ModelState, event: Any) -> ModelState:
    """The model after ``event``; raises ``ModelReject`` (``m`` unchanged) if it is illegal."""
    rule = RULES.get(type(event).__name__)
    if rule is None:
        raise ModelReject(f"no model rule for {type(event).__name__}")
    out = clone(m)
    rule(out, event)
    return out
