"""The model's block-pool rules (vLLM V1): alloc, hold, release, cache, uncache, clear.

Written from ``kvstate.events.block`` and docs/vllm.md.  In block mode a
page is free (queued, no holder) or held by open requests (once each; the
page sits in the request's table) and by anonymous pool references
(``ModelState.pool``, vLLM's ``ref_cnt`` beyond the requests; they may
repeat).  Caching is orthogonal: a node of the prefix tree is one block
keyed by its tokens and extra keys and lists its physical copies, oldest
first; a cached page with no holder stays queued.  Page 0 is the null
block: it may fill request-table entries and is never held, queued or
cached.  A node with no copy and no child does not exist (it is pruned).
"""

from __future__ import annotations

from typing import Any

from specs.model_state import (
    DETACHED,
    ROOT,
    Holder,
    MNode,
    ModelState,
    distinct,
    open_request,
    push,
    require,
    valid_page,
)


def _block_mode(m: ModelState, e: Any) -> None:
    require(m.mode == "block", f"{type(e).__name__} needs a block-mode geometry")


def _is_request(m: ModelState, holder: Holder) -> bool:
    """True for a request holder (which must be open), False for the pool (DETACHED)."""
    if holder == DETACHED and isinstance(holder, int):
        return False
    open_request(m, holder)
    return True


def _width(m: ModelState, holder: Holder, added: int) -> None:
    entries = len(m.requests[holder].pages) + added
    require(entries * m.page_size <= m.row_width, f"{holder!r} would map past the row width")


def _add_hold(m: ModelState, holder: Holder, page: int, is_request: bool) -> None:
    if not m.held(page):  # a queued page (cached or not) leaves the queue
        m.free.remove(page)
    if is_request:
        m.holders.setdefault(page, set()).add(holder)
    else:
        m.pool[page] = m.pool.get(page, 0) + 1


def _extend_table(m: ModelState, holder: Holder, pages: list[int]) -> None:
    req = m.requests[holder]
    req.pages.extend(pages)
    req.allocated = len(req.pages) * m.page_size


def block_alloc(m: ModelState, e: Any) -> None:
    _block_mode(m, e)
    is_request = _is_request(m, e.holder)
    pages = list(e.pages)
    require(pages == m.free[: len(pages)], f"pages {pages} are not the head of the free queue")
    owner = m.tree_page_owner()
    for page in pages:
        require(page not in owner, f"page {page} is still cached: uncache it before reuse")
    if is_request:
        _width(m, e.holder, len(pages))
    for page in pages:
        _add_hold(m, e.holder, page, is_request)
    if is_request:
        _extend_table(m, e.holder, pages)


def block_hold(m: ModelState, e: Any) -> None:
    _block_mode(m, e)
    is_request = _is_request(m, e.holder)
    real = [page for page in e.pages if page != 0]
    require(is_request or len(real) == len(e.pages), "the null page only pads a request table")
    for page in real:
        valid_page(m, page)
    if is_request:
        distinct(real, "page")
        table = set(m.requests[e.holder].pages)
        for page in real:
            require(page not in table and e.holder not in m.holders.get(page, ()),
                    f"{e.holder!r} already holds page {page}")
        _width(m, e.holder, len(e.pages))
    for page in real:
        _add_hold(m, e.holder, page, is_request)
    if is_request:
        _extend_table(m, e.holder, list(e.pages))


def block_release(m: ModelState, e: Any) -> None:
    _block_mode(m, e)
    is_request = _is_request(m, e.holder)
    require(is_request or not e.close, "close needs a request holder")
    real = [page for page in e.pages if page != 0]
    distinct(real, "page")  # a page twice in one release is a double free
    for page in real:
        valid_page(m, page)
        if is_request:
            require(e.holder in m.holders.get(page, ()), f"page {page} is not held by {e.holder!r}")
        else:
            require(m.pool.get(page, 0) > 0, f"page {page} has no pool reference")
    if e.close:
        mapped = [page for page in m.requests[e.holder].pages if page != 0]
        require(sorted(mapped) == sorted(real), "closing must release every page of the table")
    owner = m.tree_page_owner()
    to_head: list[int] = []
    to_tail: list[int] = []
    for page in real:
        if is_request:
            m.holders[page].discard(e.holder)
            if not m.holders[page]:
                del m.holders[page]
        else:
            m.pool[page] -= 1
            if not m.pool[page]:
                del m.pool[page]
        if not m.held(page):
            (to_tail if e.cached_to_tail and page in owner else to_head).append(page)
    if is_request:
        if e.close:  # closed like ReqFree: a row goes back on top of the row stack
            del m.requests[e.holder]
            if isinstance(e.holder, int):
                m.free_rows.insert(0, e.holder)
        else:
            req = m.requests[e.holder]
            req.pages = [0 if page in real else page for page in req.pages]
    m.free = push(push(m.free, to_head, True), to_tail, False)


def _prune(m: ModelState) -> None:
    """Delete every node with no copy and no child, until none is left."""
    while True:
        parents = {node.parent for node in m.nodes.values()}
        empty = [n for n, node in m.nodes.items()
                 if n != ROOT and not node.pages and n not in parents]
        if not empty:
            return
        for node_id in empty:
            del m.nodes[node_id]


def block_cache(m: ModelState, e: Any) -> None:
    _block_mode(m, e)
    require(e.parent in m.nodes, f"unknown tree node {e.parent}")
    require(0 <= e.stored_from <= len(e.entries), "stored_from outside the entries")
    current = e.parent
    for index, (node_id, key, extra, page) in enumerate(e.entries):
        require(len(key) == m.page_size, f"entry {index}: a key of one block is {m.page_size} tokens")
        wanted = m.child_key(key, extra)
        found = [c for c in m.children(current)
                 if m.child_key(m.nodes[c].key, m.nodes[c].extra) == wanted]
        if found:
            require(node_id == found[0], f"entry {index}: the child is node {found[0]}")
        else:  # a new node on the chain: the next id, empty until it gets a copy
            require(node_id == m.next_node, f"entry {index}: a new node must be {m.next_node}")
            m.nodes[node_id] = MNode(current, tuple(key), [], 0, 0, extra)
            m.next_node += 1
        if page:
            require(index >= e.stored_from, f"entry {index} is before stored_from")
            valid_page(m, page)
            require(page not in m.tree_page_owner(), f"page {page} is already cached")
            require(m.held(page), f"page {page} is free: cache only held pages")
            m.nodes[node_id].pages.append(page)
        current = node_id
    _prune(m)


def block_uncache(m: ModelState, e: Any) -> None:
    _block_mode(m, e)
    require(len(e.pages) == len(e.nodes), "one node per page")
    distinct(e.pages, "page")
    for page, node_id in zip(e.pages, e.nodes, strict=True):
        require(node_id in m.nodes and page in m.nodes[node_id].pages,
                f"page {page} is not a cached copy of node {node_id}")
    for page, node_id in zip(e.pages, e.nodes, strict=True):
        m.nodes[node_id].pages.remove(page)
    _prune(m)


def block_clear(m: ModelState, e: Any) -> None:
    _block_mode(m, e)
    m.nodes = {ROOT: m.nodes[ROOT]}
