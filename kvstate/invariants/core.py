"""The core's named invariants, each recomputed from scratch over a whole state.

Every check reads only attribute names a frozen ``State`` and a ``LiveState``
share, so it takes either.  None trusts the rules' own bookkeeping: the
derived indexes (``leaves``, ``tree_refs``, each node's ``below``) are
recomputed and compared.  Pure and read-only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvstate.invariants.registry import named as _named
from kvstate.state import DETACHED, ROOT, RequestId, block_child_key

State = Any  # a frozen State or a LiveState
_WHOLE_SET_LIMIT = 1 << 22  # above this many pages, conservation counts instead of listing


@_named("conservation")
def _conservation(state: State) -> Iterator[str]:
    """Free, request/DETACHED-held and tree-held pages partition pages 1..N.

    Block mode: free and held partition 1..N; a cached page may be either.
    """
    # In block mode the tree does not hold (a cached page may also be free);
    # tree pages must still lie in 1..N.
    block_mode = state.geometry.mode == "block"
    num_pages = state.geometry.num_pages
    tree_pages = set(state.page_node.keys())
    held = set(state.holders.keys()) if block_mode else set(state.holders.keys()) | tree_pages
    free_pages = state.free_pages
    both = [page for page in held if page in free_pages]
    if both:
        yield f"pages both free and held: {sorted(both)[:8]}"
    stray = [page for page in held | tree_pages if not 1 <= page <= num_pages]
    if num_pages > _WHOLE_SET_LIMIT:  # count, never build a set of every page
        if len(free_pages) + len(held) != num_pages:
            yield (f"{len(free_pages)} free and {len(held)} held pages do not add up to "
                   f"{num_pages} (a page leaked or is listed twice)")
    else:
        free = list(free_pages)
        if len(free) != len(set(free)):
            yield "the free list has a duplicate page"
        free_set = set(free)
        missing = set(range(1, num_pages + 1)) - free_set - held
        if missing:
            yield f"pages neither free nor held (leaked): {sorted(missing)[:8]}"
        stray.extend(page for page in free_set if not 1 <= page <= num_pages)
    if stray:
        yield f"pages outside 1..N (page 0 is reserved): {sorted(stray)[:8]}"


@_named("refcounts")
def _refcounts(state: State) -> Iterator[str]:
    """Every holder is real: an open request whose table maps the page, or DETACHED.

    Block mode: DETACHED (pool-level references) may repeat and sit beside requests.
    """
    tables = _TableSets(state)
    for page, held in state.holders.items():
        yield from page_holders(state, page, held, tables)


class _TableSets:
    """Each request's mapped pages as a set, built on first use (one pass per table)."""

    def __init__(self, state: State) -> None:
        self.requests = state.requests
        self.sets: dict[RequestId, set[int]] = {}

    def maps(self, request_id: RequestId, page: int) -> bool | None:
        """Whether the request maps ``page``; ``None`` when it is not open."""
        pages = self.sets.get(request_id)
        if pages is None:
            record = self.requests.get(request_id)
            if record is None:
                return None
            pages = self.sets[request_id] = set(mapped_pages(record))
        return page in pages


def page_holders(state: State, page: int, held: Any, tables: Any = None) -> Iterator[str]:
    """``refcounts`` for one page (also the incremental checker's unit)."""
    tables = _TableSets(state) if tables is None else tables
    if state.geometry.mode == "block":
        yield from _block_holders(page, held, tables)
        return
    if not held:
        yield f"page {page} has an empty holder entry"
    if len(held) != len(set(held)):
        yield f"page {page} lists a holder twice: {list(held)}"
    for holder in held:
        if holder == DETACHED:
            if len(held) > 1:
                yield f"page {page} is DETACHED and held by requests {list(held)}"
            continue
        maps = tables.maps(holder, page)
        if maps is None:
            yield f"page {page} is held by closed request {holder!r}"
        elif not maps:
            yield f"page {page} is held by request {holder!r} but not in its table"


@_named("reserved_ids")
def _reserved_ids(state: State) -> Iterator[str]:
    """Row 0 and page 0 are never handed out; rows partition into free and open."""
    if 0 in state.requests:
        yield "row 0 is open as a request"
    if 0 in state.holders or 0 in state.page_node or 0 in state.free_pages:
        yield "page 0 is tracked as free or held"
    rows = [r for r in state.requests.keys() if isinstance(r, int)]
    free_rows = list(state.free_rows)
    if len(free_rows) != len(set(free_rows)):
        yield "the free row stack has a duplicate row"
    if len(rows) + len(free_rows) != state.geometry.num_rows or sorted(rows + free_rows) != list(
            range(1, state.geometry.num_rows + 1)):
        yield "open rows and free rows do not partition 1..num_rows"


@_named("tree_sizes")
def _tree_sizes(state: State) -> Iterator[str]:
    """evictable + protected == tree tokens; protected exactly where lock_ref > 0."""
    evictable = protected = 0
    for node_id, node in state.nodes.items():
        if node_id == ROOT:
            continue
        if node.lock_ref > 0:
            protected += len(node.key)
        else:
            evictable += len(node.key)
    if (evictable, protected) != (state.evictable_size, state.protected_size):
        yield (f"evictable/protected are {state.evictable_size}/{state.protected_size}, "
               f"nodes say {evictable}/{protected}")
    root_node = state.nodes.get(ROOT)
    if root_node is None or root_node.lock_ref != 1 or root_node.key:
        yield "the root must exist with an empty key and lock_ref 1"


@_named("leaf_index")
def _leaf_index(state: State) -> Iterator[str]:
    """The evictable-leaf index equals the unlocked childless nodes below the root (radix mode)."""
    if state.geometry.mode != "radix":
        return
    expected = {n for n, node in state.nodes.items()
                if n != ROOT and node.lock_ref == 0 and not node.children}
    actual = set(state.leaves.keys())
    if actual != expected:
        yield (f"leaf index is off: missing {sorted(expected - actual)[:8]}, "
               f"extra {sorted(actual - expected)[:8]}")


@_named("lock_monotonic")
def _lock_monotonic(state: State) -> Iterator[str]:
    """lock_ref(parent) >= lock_ref(child) below the root; no negative locks; each node's
    ``below`` index is its children's lock total."""
    nodes = state.nodes
    for node_id, node in nodes.items():
        yield from node_locks(nodes, node_id, node)


def node_locks(nodes: Any, node_id: int, node: Any, below: int | None = None) -> Iterator[str]:
    """``lock_monotonic`` for one node (also the incremental checker's unit, which passes
    ``below``, its children's lock total, from its shadows instead of summing them)."""
    if node.lock_ref < 0:
        yield f"node {node_id} has negative lock_ref {node.lock_ref}"
    if node_id != ROOT:
        if below is None:
            below = sum(nodes[c].lock_ref for c in node.children.values() if c in nodes)
        if node.below != below:
            yield f"node {node_id} below index is {node.below}, its children hold {below}"
    if node_id == ROOT or node.parent == ROOT:
        return
    parent = nodes.get(node.parent)
    if parent is not None and parent.lock_ref < node.lock_ref:
        yield f"node {node_id} lock_ref {node.lock_ref} exceeds its parent's {parent.lock_ref}"


@_named("node_shape")
def _node_shape(state: State) -> Iterator[str]:
    """Keys and values agree, are page multiples, and the child index is exact.

    Block mode (vLLM): one block of tokens per node, its copies listed once,
    no empty leaf, children indexed by (tokens, extra keys).
    """
    size = state.geometry.page_size
    for node_id, node in state.nodes.items():
        if node_id == ROOT:
            continue
        if state.geometry.mode == "block":
            if len(node.key) != size:
                yield f"node {node_id} key length {len(node.key)} is not the block size {size}"
            if not node.pages and not len(node.children):
                yield f"node {node_id} has no copy and no child (should have been pruned)"
            if len(node.pages) != len(set(node.pages)):
                yield f"node {node_id} lists a copy twice: {list(node.pages)}"
        elif not node.key or len(node.key) != len(node.pages) * size:
            yield f"node {node_id} key length {len(node.key)} vs {len(node.pages)} pages"
    yield from _tree_links(state)


def node_child_key(geometry: Any, node: Any) -> Any:
    """The key ``node`` is indexed under in its parent (None for an empty radix key, which
    the shape check reports: a damaged state is described, never crashes the check)."""
    if geometry.mode == "block":
        return block_child_key(node.key, node.extra)
    return geometry.child_key(node.key) if node.key else None


def _tree_links(state: State) -> Iterator[str]:
    """Parent and child links, the child index and page ownership agree both ways."""
    geometry = state.geometry
    for node_id, node in state.nodes.items():
        if node_id != ROOT:
            parent = state.nodes.get(node.parent)
            if parent is None:
                yield f"node {node_id} has missing parent {node.parent}"
            elif parent.children.get(node_child_key(geometry, node)) != node_id:
                yield f"node {node_id} is not indexed under its key in its parent"
            for page in node.pages:
                if state.page_node.get(page) != node_id:
                    yield f"node {node_id} page {page} is not recorded as its"
        for child_key, child_id in node.children.items():
            child = state.nodes.get(child_id)
            if child is None or child.parent != node_id:
                yield f"node {node_id} child {child_id} does not point back"
            elif node_child_key(geometry, child) != child_key:
                yield f"node {node_id} indexes child {child_id} under a wrong key"
    for page, owner_id in state.page_node.items():
        owner = state.nodes.get(owner_id)
        if owner is None or page not in owner.pages:
            yield f"page {page} claims tree node {owner_id}, which does not hold it"


@_named("request_lengths")
def _request_lengths(state: State) -> Iterator[str]:
    """committed <= allocated <= row width; the page table covers exactly the mapped tokens;
    dangling entries are distinct table indices in order."""
    for request_id, record in state.requests.items():
        yield from request_shape(state, request_id, record)


def request_shape(state: State, request_id: RequestId, record: Any) -> Iterator[str]:
    """``request_lengths`` for one request (also the incremental checker's unit)."""
    size, width = state.geometry.page_size, state.geometry.row_width
    if not 0 <= record.committed <= record.allocated <= width:
        yield (f"request {request_id!r}: committed {record.committed}, "
               f"allocated {record.allocated}, width {width}")
    if len(record.pages) != -(-record.allocated // size):
        yield f"request {request_id!r}: {len(record.pages)} pages for {record.allocated} tokens"
    dangling = record.dangling
    if dangling and (list(dangling) != sorted(set(dangling)) or dangling[0] < 0
                     or dangling[-1] >= len(record.pages)):
        yield f"request {request_id!r}: dangling entries {list(dangling)[:8]} are not table indices"


@_named("table_refs_live")
def _table_refs_live(state: State) -> Iterator[str]:
    """Every page a request maps is held by it or by the tree (no use-after-free).

    Block mode: by the request itself (the tree does not hold); page 0 is the null block.
    """
    if state.geometry.mode == "block":
        for request_id, record in state.requests.items():
            for page in record.pages:
                if page and request_id not in state.holders.get(page, ()):
                    yield f"request {request_id!r} maps page {page}, which it does not hold"
        return
    if state.geometry.mode == "radix":
        counted: dict[int, int] = {}
        for request_id, record in state.requests.items():
            for page in mapped_pages(record):
                if page in state.page_node and request_id not in state.holders.get(page, ()):
                    counted[page] = counted.get(page, 0) + 1
        if counted != dict(state.tree_refs.items()):
            yield "the index of tree pages mapped without a hold is off"
    for request_id, record in state.requests.items():
        yield from request_refs(state, request_id, record)


def mapped_pages(record: Any) -> list[int]:
    """The pages a request's table really maps: every entry but the dangling ones."""
    if not record.dangling:
        return list(record.pages)
    gone = set(record.dangling)
    return [page for index, page in enumerate(record.pages) if index not in gone]


def request_refs(state: State, request_id: RequestId, record: Any) -> Iterator[str]:
    """``table_refs_live`` for one radix-mode request (also the incremental checker's unit)."""
    for page in mapped_pages(record):
        if page not in state.page_node and request_id not in state.holders.get(page, ()):
            yield f"request {request_id!r} maps page {page}, which neither it nor the tree holds"


@_named("clock")
def _clock(state: State) -> Iterator[str]:
    """No node was touched after the logical clock."""
    for node_id, node in state.nodes.items():
        if node.last_access > state.clock:
            yield f"node {node_id} access time {node.last_access} is after clock {state.clock}"


# -- block mode (vLLM V1 block pool) ----------------------------------------------
def _block_holders(page: int, held: tuple[RequestId, ...], tables: Any) -> Iterator[str]:
    if not held:
        yield f"page {page} has an empty holder entry"
    requests = [h for h in held if h != DETACHED or isinstance(h, str)]
    if len(requests) != len(set(requests)):
        yield f"page {page} lists a request holder twice: {list(held)}"
    for holder in requests:
        maps = tables.maps(holder, page)
        if maps is None:
            yield f"page {page} is held by closed request {holder!r}"
        elif not maps:
            yield f"page {page} is held by request {holder!r} but not in its table"
