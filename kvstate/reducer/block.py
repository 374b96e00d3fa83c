"""Reducer rules of the block-pool mode (vLLM V1): alloc, hold, release, cache, uncache, clear.

Owned by the vLLM front end (issue 7).  Every rule rejects a state whose
geometry is not ``mode="block"``.  Page life cycle in block mode::

    free (queued, no holder) --BlockAlloc--> held --BlockRelease--> free
      ^   (must be uncached)                 |  ^                    (head if uncached,
      |                                      |  |                     tail if cached)
      +------------ BlockHold (revive) ------+--+
    cached: orthogonal; BlockCache adds a held page as a copy of a tree node,
            BlockUncache / BlockClear remove it without moving the page

The tree has one node per block (key = one page of tokens, plus the node's
``extra`` keys in the child index); a node holds zero or more copies (a
hollow node keeps a chain position whose copies were evicted while a
descendant is still cached).  Pure functions; nothing here mutates its inputs.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any, Protocol

from immutables import Map, MapMutation

from kvstate.events_block import (
    BlockAlloc,
    BlockCache,
    BlockClear,
    BlockHold,
    BlockRelease,
    BlockUncache,
)
from kvstate.reducer import Reject, handles
from kvstate.reducer.common import check_distinct, check_page_id, check_request
from kvstate.state import (
    DETACHED,
    ROOT,
    ChildKey,
    Node,
    Request,
    RequestId,
    State,
    block_child_key,
)


def _require_block(state: State, name: str) -> None:
    if state.geometry.mode != "block":
        raise Reject(f"{name} needs a block-mode geometry (mode={state.geometry.mode!r})")


def _check_holder(state: State, holder: RequestId) -> bool:
    """True for a request holder (which must be open), False for DETACHED."""
    if holder == DETACHED and not isinstance(holder, str):
        return False
    check_request(state, holder)
    return True


def _extend_table(state: State, request_id: RequestId, pages: tuple[int, ...]) -> Map:
    record = state.requests[request_id]
    size = state.geometry.page_size
    table = record.pages.extend(pages)
    if len(table) * size > state.geometry.row_width:
        raise Reject(f"request {request_id!r} would map {len(table) * size} tokens, "
                     f"past the row width {state.geometry.row_width}")
    return state.requests.set(request_id, Request(table, len(table) * size, record.committed))


@handles(BlockAlloc)
def block_alloc(state: State, event: BlockAlloc) -> State:
    _require_block(state, "BlockAlloc")
    pages = event.pages
    is_request = _check_holder(state, event.holder)
    if not pages:
        return state
    queue = state.free_pages
    head = queue.head(len(pages))
    if list(pages) != head:
        check_distinct(pages, "page")
        for page in pages:
            check_page_id(state, page)
            if page not in queue:
                raise Reject(f"page {page} is not free (allocating a held page)")
        raise Reject(f"pages {list(pages)} are not the head of the free queue {head}")
    page_node = state.page_node
    held = (event.holder,)
    with state.holders.mutate() as out:
        for page in pages:
            if page in page_node:
                raise Reject(f"page {page} is still cached (tree node {page_node[page]}); "
                             "uncache it before reuse")
            out[page] = held
        holders = out.finish()
    requests = _extend_table(state, event.holder, pages) if is_request else state.requests
    return state.with_changes(free_pages=queue.take(pages), holders=holders, requests=requests)


@handles(BlockHold)
def block_hold(state: State, event: BlockHold) -> State:
    _require_block(state, "BlockHold")
    holder, pages = event.holder, event.pages
    is_request = _check_holder(state, holder)
    real = [page for page in pages if page != 0]
    if not is_request and len(real) != len(pages):
        raise Reject("the null page 0 can only pad a request table")
    if is_request:
        check_distinct(real, "page")
        table = set(state.requests[holder].pages)
    revived: list[int] = []
    num_pages = state.geometry.num_pages
    with state.holders.mutate() as out:
        for page in real:
            if not 0 < page <= num_pages:
                check_page_id(state, page)
            held = out.get(page, ())
            if is_request and (holder in held or page in table):
                raise Reject(f"request {holder!r} already holds page {page}")
            if not held:
                revived.append(page)
            out[page] = (*held, holder)
        holders = out.finish()
    queue = state.free_pages.take(revived) if revived else state.free_pages
    requests = _extend_table(state, holder, pages) if is_request else state.requests
    return state.with_changes(free_pages=queue, holders=holders, requests=requests)


class Holders(Protocol):
    """What ``drop_one_hold`` needs: a dict, or an ``immutables`` map mutation."""

    def __getitem__(self, key: int, /) -> tuple[RequestId, ...]: ...
    def __setitem__(self, key: int, value: tuple[RequestId, ...], /) -> None: ...
    def __delitem__(self, key: int, /) -> None: ...


def drop_one_hold(holders: Holders, page_node: Container[int], page: int, holder: RequestId,
                  cached_to_tail: bool, to_head: list[int], to_tail: list[int]) -> None:
    """Remove one ``holder`` entry of ``page`` (mutates ``holders``); a page left with no
    holder goes on ``to_tail`` (cached, with ``cached_to_tail``) or ``to_head``.

    Shared by this reducer (on a map mutation) and the transient rule (on a dict).
    """
    held = holders[page]
    index = held.index(holder)
    rest = held[:index] + held[index + 1:]
    if rest:
        holders[page] = rest
        return
    del holders[page]
    if cached_to_tail and page in page_node:
        to_tail.append(page)
    else:
        to_head.append(page)


@handles(BlockRelease)
def block_release(state: State, event: BlockRelease) -> State:
    _require_block(state, "BlockRelease")
    holder = event.holder
    is_request = _check_holder(state, holder)
    real = [page for page in event.pages if page != 0]
    check_distinct(real, "page")  # a duplicate inside one release is a double free
    page_node = state.page_node
    to_head: list[int] = []
    to_tail: list[int] = []
    with state.holders.mutate() as out:
        for page in real:
            held = out.get(page)
            if held is None or holder not in held:
                check_page_id(state, page)
                state_word = "free (double free)" if held is None else f"held by {list(held)}"
                raise Reject(f"page {page} is not held by {holder!r}: it is {state_word}")
            drop_one_hold(out, page_node, page, holder, event.cached_to_tail, to_head, to_tail)
        holders = out.finish()
    requests = state.requests
    if is_request:
        record = requests[holder]
        if event.close:
            mapped = [page for page in record.pages if page != 0]
            if len(mapped) != len(real) or set(mapped) != set(real):
                raise Reject(f"closing request {holder!r} must release all its pages {mapped}")
            requests = requests.delete(holder)
        else:
            position = {page: index for index, page in enumerate(record.pages) if page != 0}
            table = record.pages
            for page in real:
                table = table.set(position[page], 0)
            requests = requests.set(holder, Request(table, record.allocated, record.committed))
    elif event.close:
        raise Reject("close needs a request holder")
    queue = state.free_pages
    if to_head:
        queue = queue.push_head(to_head)
    if to_tail:
        queue = queue.push_tail(to_tail)
    return state.with_changes(free_pages=queue, holders=holders, requests=requests)


class _WithChildren(Protocol):
    @property
    def children(self) -> Mapping[Any, int]: ...


def resolve_cache_path(nodes: Mapping[int, _WithChildren], next_node_id: int, event: BlockCache,
                       size: int, num_pages: int, holders: Container[int],
                       page_node: Mapping[int, int]) -> tuple[list[tuple[Any, ...]], int, int, int]:
    """``BlockCache`` pass 1 (reads only; raises ``Reject``): resolve each entry to an
    existing child or the next fresh node id and check its page.

    Returns ``(child keys, index of the first new node, next free node id, last node)``.
    Shared by this reducer and the transient rule (any node map whose values have
    ``children``).
    """
    entries, stored_from = event.entries, event.stored_from
    keys: list[tuple[Any, ...]] = []
    first_new = len(entries)
    next_id = next_node_id
    current = event.parent
    seen: set[int] = set()
    for index, (node_id, key, extra, page) in enumerate(entries):
        if len(key) != size:
            raise Reject(f"entry {index}: key of {len(key)} tokens, block size is {size}")
        child_key = block_child_key(key, extra)
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


@handles(BlockCache)
def block_cache(state: State, event: BlockCache) -> State:
    _require_block(state, "BlockCache")
    nodes = state.nodes
    if event.parent not in nodes:
        raise Reject(f"unknown tree node {event.parent}")
    entries = event.entries
    stored_from = event.stored_from
    if not 0 <= stored_from <= len(entries):
        raise Reject(f"stored_from {stored_from} outside 0..{len(entries)}")
    size = state.geometry.page_size
    page_node = state.page_node
    keys, first_new, next_id, current = resolve_cache_path(
        nodes, state.next_node_id, event, size, state.geometry.num_pages, state.holders, page_node)
    # Pass 2: build (new nodes are created whole: their pages and their one child).
    with nodes.mutate() as out_nodes, page_node.mutate() as out_pages:
        for index in range(first_new):
            node_id, _key, _extra, page = entries[index]
            if page:
                target = out_nodes[node_id]
                out_nodes[node_id] = target._replace(pages=(*target.pages, page))
                out_pages[page] = node_id
        if first_new < len(entries):
            attach = entries[first_new - 1][0] if first_new else event.parent
            parent = out_nodes[attach]
            out_nodes[attach] = parent._replace(
                children=parent.children.set(keys[first_new], entries[first_new][0]))
            last = len(entries) - 1
            for index in range(first_new, len(entries)):
                node_id, key, extra, page = entries[index]
                children: Map[ChildKey, int] = (
                    Map({keys[index + 1]: entries[index + 1][0]}) if index < last else Map())
                out_nodes[node_id] = Node(attach, key, (page,) if page else (), children, 0, 0,
                                          extra)
                if page:
                    out_pages[page] = node_id
                attach = node_id
        pruned = _prune(out_nodes, current)  # trailing positions that got no copy (null blocks)
        new_nodes, new_page_node = out_nodes.finish(), out_pages.finish()
    created = next_id - state.next_node_id - pruned
    return state.with_changes(nodes=new_nodes, page_node=new_page_node, next_node_id=next_id,
                              evictable_size=state.evictable_size + created * size)


def _prune(nodes: MapMutation[int, Node], node_id: int) -> int:
    """Delete ``node_id`` and its ancestors while they have no copy and no child; the count."""
    removed = 0
    current = node_id
    while current != ROOT:
        found = nodes.get(current)
        if found is None or found.pages or len(found.children):
            break
        parent = nodes[found.parent]
        nodes[found.parent] = parent._replace(
            children=parent.children.delete(block_child_key(found.key, found.extra)))
        del nodes[current]
        removed += 1
        current = found.parent
    return removed


@handles(BlockUncache)
def block_uncache(state: State, event: BlockUncache) -> State:
    _require_block(state, "BlockUncache")
    if len(event.pages) != len(event.nodes):
        raise Reject("uncache needs one node per page")
    check_distinct(event.pages, "page")
    for page, node_id in zip(event.pages, event.nodes, strict=True):
        if state.page_node.get(page) != node_id:
            check_page_id(state, page)
            raise Reject(f"page {page} is not a cached copy of node {node_id}")
    removed = 0
    with state.nodes.mutate() as nodes, state.page_node.mutate() as page_node:
        for page, node_id in zip(event.pages, event.nodes, strict=True):
            node = nodes[node_id]
            nodes[node_id] = node._replace(pages=tuple(p for p in node.pages if p != page))
            del page_node[page]
        for node_id in dict.fromkeys(event.nodes):
            removed += _prune(nodes, node_id)
        new_nodes, new_page_node = nodes.finish(), page_node.finish()
    return state.with_changes(nodes=new_nodes, page_node=new_page_node,
                              evictable_size=state.evictable_size - removed * state.page_size)


@handles(BlockClear)
def block_clear(state: State, event: BlockClear) -> State:
    _require_block(state, "BlockClear")
    root = state.nodes[ROOT]
    return state.with_changes(nodes=Map({ROOT: root._replace(children=Map())}),
                              page_node=Map(), evictable_size=0)
