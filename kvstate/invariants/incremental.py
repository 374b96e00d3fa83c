"""The named invariants, checked only where events changed a live state.

``IncrementalChecker(live)`` switches on the rules' change reports
(``LiveState.touched``) and keeps a few shadows the rules never see: each
request's mapped pages and their reverse index (page -> requests mapping
it), each node's token contribution to the tree sizes, each node's parent
and lock count with each parent's children count and lock total, and the
number of open rows.  ``check()`` then verifies every named property on
the pages (``kvstate.invariants.incremental_pages``), nodes and requests
touched since the last call, plus the global sums, in time proportional to
that change.  After a reset (``touched.everything``) it runs the full
checks and rebuilds its shadows.

The full checks in ``kvstate.invariants.core`` stay the definition; tests
compare the two on every event of seeded runs.  Owns its shadows; never
writes the live state (beyond installing ``touched``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvstate.invariants.core import node_child_key, node_locks, request_shape
from kvstate.invariants.incremental_pages import page_violations, suspect_pages
from kvstate.invariants.mamba import check_mamba
from kvstate.invariants.mamba_incremental import MambaShadow
from kvstate.invariants.registry import HOST_NAMES, Violation, run_checks
from kvstate.invariants.swa import check_swa
from kvstate.invariants.swa_incremental import SwaShadow
from kvstate.records import RequestId
from kvstate.rules.store import Touched
from kvstate.state import ROOT


class IncrementalChecker:
    """Checks a ``LiveState`` after each run of events, looking only where it changed."""

    def __init__(self, live: Any) -> None:
        self.live = live
        live.touched = Touched()
        self.full_checks = 0
        self._rebuild()

    # -- shadows -----------------------------------------------------------------
    def _rebuild(self) -> None:
        live = self.live
        self.tables: dict[RequestId, list[int | None]] = {}  # None: a dangling entry
        self.mapped_by: dict[int, set[RequestId]] = {}
        for request_id, record in live.requests.items():
            entries = self.tables[request_id] = _entries(record)
            self._map(request_id, entries)
        self.sizes: dict[int, tuple[int, int]] = {}
        self.evictable = self.protected = 0
        # Each node's parent, child key and lock count, and per parent the children index,
        # the number of children and their lock total, all from the children's side (their
        # parent pointers and keys).  A touched parent's index is then checked by one
        # comparison with its shadow, and its ``below`` count against the total, without a
        # walk over its children (a root or a shared stem may have thousands).
        self.parent_of: dict[int, int] = {}
        self.key_of: dict[int, Any] = {}
        self.lock_of: dict[int, int] = {}
        self.kids: dict[int, int] = {}
        self.index: dict[int, dict[Any, int]] = {}
        self.locks_below: dict[int, int] = {}
        for node_id, node in live.nodes.items():
            self._size(node_id, node)
            self._reparent(node_id, node)
        self.rows = sum(1 for r in live.requests if isinstance(r, int))
        self.swa = None if live.swa is None else SwaShadow(live)  # the SWA pool's shadows
        self.mamba = None if live.mamba is None else MambaShadow(live)  # the Mamba pool's

    def _map(self, request_id: RequestId, entries: list[int | None]) -> None:
        mapped_by = self.mapped_by
        for page in entries:
            if page is not None:
                mapped_by.setdefault(page, set()).add(request_id)

    def _unmap(self, request_id: RequestId, entries: list[int | None]) -> None:
        mapped_by = self.mapped_by
        for page in entries:
            if page is None:
                continue
            owners = mapped_by.get(page)
            if owners is not None:
                owners.discard(request_id)
                if not owners:
                    del mapped_by[page]

    def _reparent(self, node_id: int, node: Any) -> None:
        """Move a changed (or removed: ``node`` None) node in the shadows of its parents."""
        kids, locks_below, index = self.kids, self.locks_below, self.index
        old = self.parent_of.pop(node_id, None)
        old_lock = self.lock_of.pop(node_id, 0)
        old_key = self.key_of.pop(node_id, None)
        if old is not None:
            kids[old] -= 1
            locks_below[old] -= old_lock
            siblings = index[old]
            if siblings.get(old_key) == node_id:  # (two children under one key: count check)
                del siblings[old_key]
        if node is None:
            if not index.get(node_id, True):
                del index[node_id]
            return
        if node_id != ROOT:
            parent, lock, key = node.parent, node.lock_ref, node_child_key(self.live.geometry, node)
            self.parent_of[node_id] = parent
            self.lock_of[node_id] = lock
            self.key_of[node_id] = key
            kids[parent] = kids.get(parent, 0) + 1
            locks_below[parent] = locks_below.get(parent, 0) + lock
            index.setdefault(parent, {})[key] = node_id

    def _relock(self, node_id: int, node: Any) -> None:
        """A node whose only change was its lock count (``Touched.locked``)."""
        if node is None or node_id not in self.parent_of:
            self._reparent(node_id, node)
            return
        self.locks_below[self.parent_of[node_id]] += node.lock_ref - self.lock_of[node_id]
        self.lock_of[node_id] = node.lock_ref

    def _size(self, node_id: int, node: Any) -> None:
        old = self.sizes.pop(node_id, (0, 0))
        self.evictable -= old[0]
        self.protected -= old[1]
        if node is None or node_id == ROOT:
            return
        tokens = len(node.key)
        new = (0, tokens) if node.lock_ref > 0 else (tokens, 0)
        self.sizes[node_id] = new
        self.evictable += new[0]
        self.protected += new[1]

    # -- checking ----------------------------------------------------------------
    def check(self) -> list[Violation]:
        """Every violation in what changed since the last call (then forgets the changes)."""
        live = self.live
        touched: Touched = live.touched
        if touched.everything:
            touched.clear()
            self.full_checks += 1
            self._rebuild()
            return run_checks(live) + [Violation(name, message) for name, message in
                                       check_swa(live) + check_mamba(live)]
        found: list[Violation] = []
        pages = set(touched.pages)  # plus the pages a changed table now maps, or no longer does
        for request_id, index in touched.requests.items():
            found.extend(self._request(request_id, index, pages))
        mapped_by = self.mapped_by
        for page in suspect_pages(live, mapped_by, pages):
            found.extend(page_violations(live, mapped_by, page))
        nodes = live.nodes
        relinked = touched.nodes | touched.locked
        for node_id in touched.nodes:  # every shadow first, then the counts agree
            self._reparent(node_id, nodes.get(node_id))
        for node_id in touched.locked - touched.nodes:
            self._relock(node_id, nodes.get(node_id))
        for node_id in touched.nodes:
            found.extend(self._node(node_id, links=True))
        for node_id in touched.locked - touched.nodes:
            found.extend(self._node(node_id, links=False, locks=True))
        for node_id in touched.stamped - relinked:
            found.extend(self._node(node_id, links=False))
        found.extend(self._globals())
        if touched.host_nodes or (live.host is not None and touched.nodes):
            found.extend(run_checks(live, tuple(sorted(HOST_NAMES))))
        if self.swa is not None:
            found.extend(self.swa.check(touched))
        if self.mamba is not None:
            found.extend(self.mamba.check(touched))
        touched.clear()
        return found

    def _request(self, request_id: RequestId, index: int, pages: set[int]) -> list[Violation]:
        """Re-map a changed request's table from ``index`` on in the shadows (adding the pages
        involved to ``pages``) and check its record.  The entries before ``index`` are not
        touched: a decode step costs what it added, not the table's length."""
        found: list[Violation] = []
        live = self.live
        record = live.requests.get(request_id)
        old = self.tables.get(request_id)
        if record is None:
            if old is not None:
                self._unmap(request_id, old)
                pages.update(page for page in old if page is not None)
                del self.tables[request_id]
            if isinstance(request_id, int):
                self.rows -= 1 if old is not None else 0
                if request_id not in live.free_rows and request_id != 0:
                    found.append(Violation("reserved_ids",
                                           f"row {request_id} is neither open nor free"))
            return found
        if old is None:
            old = self.tables[request_id] = []
            if isinstance(request_id, int):
                self.rows += 1
        elif index < len(old):
            changed = old[index:]
            self._unmap(request_id, changed)
            pages.update(page for page in changed if page is not None)
            del old[index:]
        new = _entries(record, len(old))
        if new:
            self._map(request_id, new)
            old.extend(new)
            pages.update(page for page in new if page is not None)
        found.extend(Violation("request_lengths", message)
                     for message in request_shape(live, request_id, record))
        if isinstance(request_id, int):
            if request_id == 0:
                found.append(Violation("reserved_ids", "row 0 is open as a request"))
            elif request_id in live.free_rows:
                found.append(Violation("reserved_ids", f"row {request_id} is both open and free"))
        return found

    def _node(self, node_id: int, *, links: bool, locks: bool = False) -> Iterator[Violation]:
        """A changed node's checks: its clock always; its locks and leaf entry when they may
        have changed (``locks``, or ``links``); its shape and links when it changed
        otherwise (``links``: its key, pages, parent or children)."""
        live = self.live
        node = live.nodes.get(node_id)
        self._size(node_id, node)
        in_leaves = node_id in live.leaves
        if node is None:
            if in_leaves:
                yield Violation("leaf_index", f"leaf index lists removed node {node_id}")
            return
        if node.last_access > live.clock:
            yield Violation("clock", f"node {node_id} access time {node.last_access} is after "
                                     f"clock {live.clock}")
        if not (links or locks):
            return
        for message in node_locks(live.nodes, node_id, node, self.locks_below.get(node_id, 0)):
            yield Violation("lock_monotonic", message)
        if live.geometry.mode == "radix":
            leaf = node_id != ROOT and node.lock_ref == 0 and not node.children
            if leaf != in_leaves:
                yield Violation("leaf_index", f"leaf index is off at node {node_id}")
        if not links:
            return
        kids = self.kids.get(node_id, 0)
        counted = len(node.children) == kids
        indexed = counted and node.children == self.index.get(node_id, {})
        for message in _node_links(live, node_id, node, self.key_of.get(node_id),
                                   children=not indexed):
            yield Violation("node_shape", message)
        if not counted:
            yield Violation("node_shape", f"node {node_id} indexes {len(node.children)} children, "
                                          f"{kids} nodes name it as parent")

    def _globals(self) -> Iterator[Violation]:
        live = self.live
        if (self.evictable, self.protected) != (live.evictable_size, live.protected_size):
            yield Violation("tree_sizes", f"evictable/protected are {live.evictable_size}/"
                                          f"{live.protected_size}, nodes say "
                                          f"{self.evictable}/{self.protected}")
        if self.rows + len(live.free_rows) != live.geometry.num_rows:
            yield Violation("reserved_ids", "open rows and free rows do not partition 1..num_rows")
        if 0 in live.holders or 0 in live.page_node or 0 in live.free_pages:
            yield Violation("reserved_ids", "page 0 is tracked as free or held")


def _entries(record: Any, start: int = 0) -> list[int | None]:
    """A request's table from index ``start``, dangling entries as ``None``."""
    pages = record.pages
    if not record.dangling:
        return list(pages[start:])
    gone = set(record.dangling)
    return [None if index in gone else pages[index] for index in range(start, len(pages))]


def _node_links(live: Any, node_id: int, node: Any, key: Any, *,
                children: bool) -> Iterator[str]:
    """Shape and links of one node (``key``: its child key, from the shadows): key vs
    pages, its parent's index, its pages, and (with ``children``: its index differs from
    its shadow) each child it indexes."""
    nodes, geometry = live.nodes, live.geometry
    size = geometry.page_size
    block = geometry.mode == "block"
    if node_id != ROOT:
        if block:
            if len(node.key) != size:
                yield f"node {node_id} key length {len(node.key)} is not the block size {size}"
            if not node.pages and not len(node.children):
                yield f"node {node_id} has no copy and no child (should have been pruned)"
        elif not node.key or len(node.key) != len(node.pages) * size:
            yield f"node {node_id} key length {len(node.key)} vs {len(node.pages)} pages"
        parent = nodes.get(node.parent)
        if parent is None:
            yield f"node {node_id} has missing parent {node.parent}"
        elif parent.children.get(key) != node_id:
            yield f"node {node_id} is not indexed under its key in its parent"
        for page in node.pages:
            if live.page_node.get(page) != node_id:
                yield f"node {node_id} page {page} is not recorded as its"
    if not children:
        return
    for child_key, child_id in node.children.items():
        child = nodes.get(child_id)
        if child is None or child.parent != node_id:
            yield f"node {node_id} child {child_id} does not point back"
        elif node_child_key(geometry, child) != child_key:
            yield f"node {node_id} indexes child {child_id} under a wrong key"
