"""Rules of the block-pool mode (vLLM V1): alloc, hold, release, cache, uncache, clear.

Every rule rejects a state whose geometry is not ``mode="block"``.  Page
life cycle in block mode::

    free (queued, no holder) --BlockAlloc--> held --BlockRelease--> free
      ^   (must be uncached)                 |  ^                    (head if uncached,
      |                                      |  |                     tail if cached)
      +------------ BlockHold (revive) ------+--+
    cached: orthogonal; BlockCache adds a held page as a copy of a tree node,
            BlockUncache / BlockClear remove it without moving the page

The tree has one node per block (key = one page of tokens, plus the node's
``extra`` keys in the child index); a node holds zero or more copies (a
hollow node keeps a chain position whose copies were evicted while a
descendant is still cached).
"""

from __future__ import annotations

from typing import Any

from kvstate.events import BlockAlloc, BlockCache, BlockClear, BlockHold, BlockRelease, BlockUncache
from kvstate.records import MNode, RequestId
from kvstate.rules.common import check_distinct, check_page_id, check_request
from kvstate.rules.registry import Reject, rule
from kvstate.state import DETACHED, ROOT, block_child_key

_SUFFIX_BY_ID: dict[int, tuple[Any, str]] = {}  # id(extra) -> (extra, repr): kept alive


def _child_key(key: tuple[int, ...], extra: Any) -> tuple[Any, ...]:
    """``block_child_key``, reusing the ``repr`` of an extra-keys object seen before (a front
    end passes one tuple for every block of a chain; a tuple of str / int never changes)."""
    if extra is None:
        return key if type(key) is tuple else tuple(key)
    found = _SUFFIX_BY_ID.get(id(extra))
    if found is None or found[0] is not extra:
        if len(_SUFFIX_BY_ID) >= 64:
            _SUFFIX_BY_ID.clear()
        found = _SUFFIX_BY_ID[id(extra)] = (extra, repr(extra))
    # Concatenation sizes the new tuple once (unpacking goes through a list).
    return (key if type(key) is tuple else tuple(key)) + (found[1],)


def _check_holder(s: Any, holder: RequestId) -> bool:
    """True for a request holder (which must be open), False for DETACHED."""
    if holder == DETACHED and not isinstance(holder, str):
        return False
    check_request(s, holder)
    return True


def _check_width(s: Any, request_id: RequestId, added: int) -> None:
    size = s.geometry.page_size
    mapped = (len(s.requests[request_id].pages) + added) * size
    if mapped > s.geometry.row_width:
        raise Reject(f"request {request_id!r} would map {mapped} tokens, "
                     f"past the row width {s.geometry.row_width}")


def _extend_table(s: Any, request_id: RequestId, pages: tuple[int, ...]) -> None:
    record = s.request_w(request_id)
    if s.touched is not None:
        s.touched.table(request_id, len(record.pages))
    record.pages.extend(pages)
    record.allocated = len(record.pages) * s.geometry.page_size


@rule(BlockAlloc, modes=("block",))
def block_alloc(s: Any, event: BlockAlloc) -> None:
    pages = event.pages
    is_request = _check_holder(s, event.holder)
    if not pages:
        return
    queue = s.free_pages
    head = queue.head(len(pages))
    if list(pages) != head:
        check_distinct(pages, "page")
        for page in pages:
            check_page_id(s, page)
            if page not in queue:
                raise Reject(f"page {page} is not free (allocating a held page)")
        raise Reject(f"pages {list(pages)} are not the head of the free queue {head}")
    page_node = s.page_node
    for page in pages:
        if page in page_node:
            raise Reject(f"page {page} is still cached (tree node {page_node[page]}); "
                         "uncache it before reuse")
    if is_request:
        _check_width(s, event.holder, len(pages))
    s.free_pages = queue.take(pages)
    held = (event.holder,)
    holders = s.holders
    for page in pages:
        holders[page] = held
    if is_request:
        _extend_table(s, event.holder, pages)
    if s.touched is not None:
        s.touched.pages.update(pages)


@rule(BlockHold, modes=("block",))
def block_hold(s: Any, event: BlockHold) -> None:
    holder, pages = event.holder, event.pages
    is_request = _check_holder(s, holder)
    real = [page for page in pages if page != 0] if 0 in pages else list(pages)
    if not is_request and len(real) != len(pages):
        raise Reject("the null page 0 can only pad a request table")
    holders = s.holders
    num_pages = s.geometry.num_pages
    if is_request:
        check_distinct(real, "page")
        # A request holds exactly the pages its table maps (``refcounts``,
        # ``table_refs_live``): the table alone says which it already holds.
        table = set(s.requests[holder].pages)
        for page in real:
            if not 0 < page <= num_pages:
                check_page_id(s, page)
            if page in table:
                raise Reject(f"request {holder!r} already holds page {page}")
        _check_width(s, holder, len(pages))
    elif real and (min(real) < 1 or max(real) > num_pages):
        for page in real:
            check_page_id(s, page)
    # Pages nobody held leave the free queue, once each (a pool-level holder may repeat one,
    # so holders are extended one by one).
    revived = []
    single = (holder,)
    held_by = holders.get
    for page in real:
        held = held_by(page)
        if held is None:
            revived.append(page)
            holders[page] = single
        else:
            holders[page] = held + single
    if revived:
        s.free_pages = s.free_pages.take(revived)
    if is_request:
        _extend_table(s, holder, pages)
    if s.touched is not None:
        s.touched.pages.update(real)


@rule(BlockRelease, modes=("block",))
def block_release(s: Any, event: BlockRelease) -> None:
    holder = event.holder
    is_request = _check_holder(s, holder)
    pages = event.pages
    real = pages if 0 not in pages else tuple([page for page in pages if page != 0])
    holders, page_node = s.holders, s.page_node
    if is_request and event.close:
        # The pages must be exactly the table's.  A table maps distinct pages
        # (``table_injective``), each held by its request (``table_refs_live``), so this
        # one comparison also rules out a duplicate and a page the request does not hold.
        table = s.requests[holder].pages
        mapped = table if 0 not in table else [page for page in table if page != 0]
        # the usual order is the table's, reversed (vLLM frees the tail first)
        if len(mapped) != len(real) or (mapped != list(reversed(real))
                                        and set(mapped) != set(real)):
            check_distinct(real, "page")  # name a double free as such
            raise Reject(f"closing request {holder!r} must release all its pages {mapped}")
    else:
        if event.close:
            raise Reject("close needs a request holder")
        check_distinct(real, "page")  # a duplicate inside one release is a double free
        held_by = holders.get
        for page in real:
            held = held_by(page)
            if held is None or holder not in held:
                check_page_id(s, page)
                state_word = "free (double free)" if held is None else f"held by {list(held)}"
                raise Reject(f"page {page} is not held by {holder!r}: it is {state_word}")
    to_head: list[int] = []
    to_tail: list[int] = []
    to_tail_if_cached = event.cached_to_tail
    for page in real:
        held = holders[page]
        if len(held) > 1:
            index = held.index(holder)
            holders[page] = held[:index] + held[index + 1:]
            continue
        del holders[page]
        if to_tail_if_cached and page in page_node:
            to_tail.append(page)
        else:
            to_head.append(page)
    if is_request:
        if event.close:
            s.close_request(holder)
            if isinstance(holder, int):  # the row goes back on top of the stack, as ReqFree does
                s.free_rows = s.free_rows.push_head([holder])
        else:
            record = s.request_w(holder)
            gone = set(real)
            record.pages[:] = [0 if page in gone else page for page in record.pages]
    if to_head:
        s.free_pages = s.free_pages.push_head(to_head)
    if to_tail:
        s.free_pages = s.free_pages.push_tail(to_tail)
    if s.touched is not None:
        s.touched.pages.update(real)
        if is_request:
            s.touched.table(holder, 0)


def _resolve_path(s: Any, event: BlockCache) -> tuple[list[tuple[Any, ...]], int, int, int]:
    """``BlockCache`` pass 1 (reads only): resolve each entry to an existing child or the
    next fresh node id and check its page.  ``(child keys, index of the first new node,
    next free node id, last node)``."""
    entries, stored_from = event.entries, event.stored_from
    size, num_pages = s.geometry.page_size, s.geometry.num_pages
    nodes, holders, page_node = s.nodes, s.holders, s.page_node
    keys: list[tuple[Any, ...]] = []
    first_new = len(entries)
    next_id = s.next_node_id
    current = event.parent
    seen: set[int] = set()
    for index, (node_id, key, extra, page) in enumerate(entries):
        if len(key) != size:
            raise Reject(f"entry {index}: key of {len(key)} tokens, block size is {size}")
        child_key = _child_key(key, extra)
        keys.append(child_key)
        if index < first_new:
            child = nodes[current].children.get(child_key)
            if child is None:
                first_new = index
            elif child != node_id:
                raise Reject(f"entry {index}: node {node_id} is not the child of {current} "
                             f"for this block (node {child} is)")
        if index >= first_new:
            if node_id != next_id:
                raise Reject(f"entry {index}: new node id must be {next_id}, got {node_id}")
            next_id += 1
        if page:
            if index < stored_from:
                raise Reject(f"entry {index} is before stored_from and caches page {page}")
            if not 0 < page <= num_pages:
                raise Reject(f"page {page} is outside 1..{num_pages}")  # page 0 skips the check
            if page in page_node or page in seen:
                raise Reject(f"page {page} is already cached (tree node "
                             f"{page_node.get(page, entries[index][0])})")
            if page not in holders:
                raise Reject(f"page {page} is free; cache only held pages")
            seen.add(page)
        current = node_id
    return keys, first_new, next_id, current


@rule(BlockCache, modes=("block",))
def block_cache(s: Any, event: BlockCache) -> None:
    if event.parent not in s.nodes:
        raise Reject(f"unknown tree node {event.parent}")
    entries = event.entries
    if not 0 <= event.stored_from <= len(entries):
        raise Reject(f"stored_from {event.stored_from} outside 0..{len(entries)}")
    keys, first_new, next_id, current = _resolve_path(s, event)
    page_node = s.page_node
    for index in range(first_new):  # existing chain positions gain a copy
        node_id, _key, _extra, page = entries[index]
        if page:
            node = s.node_w(node_id)
            node.pages = node.pages + (page,)
            page_node[page] = node_id
    pruned = 0
    if first_new < len(entries):
        attach = entries[first_new - 1][0] if first_new else event.parent
        if not any(entry[3] for entry in entries[first_new:]):
            # new positions that all get no copy would be created and pruned at once
            pruned, current = len(entries) - first_new, attach
        else:  # new nodes are created whole: their page and one child
            s.node_w(attach).children[keys[first_new]] = entries[first_new][0]
            last = len(entries) - 1
            for index in range(first_new, len(entries)):
                node_id, key, extra, page = entries[index]
                children = s.new_children()
                if index < last:
                    children[keys[index + 1]] = entries[index + 1][0]
                s.add_node(node_id, MNode(attach, tuple(key), (page,) if page else (), children,
                                          0, 0, extra))
                if page:
                    page_node[page] = node_id
                attach = node_id
    pruned += _prune(s, current)  # trailing positions that got no copy (null blocks)
    created = next_id - s.next_node_id - pruned
    s.next_node_id = next_id
    s.evictable_size += created * s.geometry.page_size
    if s.touched is not None:
        s.touched.pages.update(entry[3] for entry in entries if entry[3])
        s.touched.nodes.update(entry[0] for entry in entries)
        s.touched.nodes.add(event.parent)


def _prune(s: Any, node_id: int) -> int:
    """Delete ``node_id`` and its ancestors while they have no copy and no child; the count."""
    removed = 0
    current = node_id
    while current != ROOT:
        found = s.nodes.get(current)
        if found is None or found.pages or len(found.children):
            break
        parent = s.node_w(found.parent)
        del parent.children[block_child_key(found.key, found.extra)]
        s.drop_node(current)
        if s.touched is not None:
            s.touched.nodes.update((current, found.parent))
        removed += 1
        current = found.parent
    return removed


@rule(BlockUncache, modes=("block",))
def block_uncache(s: Any, event: BlockUncache) -> None:
    if len(event.pages) != len(event.nodes):
        raise Reject("uncache needs one node per page")
    check_distinct(event.pages, "page")
    page_node = s.page_node
    for page, node_id in zip(event.pages, event.nodes, strict=True):
        if page_node.get(page) != node_id:
            check_page_id(s, page)
            raise Reject(f"page {page} is not a cached copy of node {node_id}")
    for page, node_id in zip(event.pages, event.nodes, strict=True):
        node = s.node_w(node_id)
        node.pages = tuple(p for p in node.pages if p != page)
        del page_node[page]
    removed = 0
    for node_id in dict.fromkeys(event.nodes):
        removed += _prune(s, node_id)
    s.evictable_size -= removed * s.geometry.page_size
    if s.touched is not None:
        s.touched.pages.update(event.pages)
        s.touched.nodes.update(event.nodes)


@rule(BlockClear, modes=("block",))
def block_clear(s: Any, event: BlockClear) -> None:
    root = s.nodes[ROOT]
    for node_id in [n for n in s.snapshot("nodes").keys() if n != ROOT]:
        s.drop_node(node_id)
    s.add_node(ROOT, MNode(root.parent, root.key, root.pages, s.new_children(), root.lock_ref,
                           root.last_access, root.extra, root.below))
    s.clear("page_node")
    s.evictable_size = 0
    if s.touched is not None:
        s.touched.everything = True
