"""Rules of the block-pool mode (vLLM V1) for the prefix tree: cache, uncache, clear.

The tree has one node per block (key = one page of tokens, plus the node's
``extra`` keys in the child index); a node holds zero or more copies (a
hollow node keeps a chain position whose copies were evicted while a
descendant is still cached).  Caching never moves a page between holders or
queues (``kvstate.rules.block``).
"""

from __future__ import annotations

from typing import Any

from kvstate.events import BlockCache, BlockClear, BlockUncache
from kvstate.records import MNode
from kvstate.rules.common import check_distinct, check_page_id
from kvstate.rules.registry import Reject, rule
from kvstate.state import ROOT, block_child_key

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
    seen: dict[int, int] = {}  # page -> the node an earlier entry of this event caches it at
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
                             f"{page_node.get(page, seen.get(page))})")
            if page not in holders:
                raise Reject(f"page {page} is free; cache only held pages")
            seen[page] = node_id
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
        if not any([entry[3] for entry in entries[first_new:]]):
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
