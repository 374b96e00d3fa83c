"""Planning for the seed-002 ``KVCacheManager``: every decision it makes, as events.

Each ``plan_*`` function takes a builder ``b`` (the engine's open batch, or a
``PlanBuilder``), reads ``b.state``, decides and emits.  Every check happens
before the first ``emit``: a refusal (``None`` / ``False``) emits nothing, so
the caller's batch is either applied whole or is empty.  The front end
(``kvstate.kv_manager``) owns argument checks, errors and the K/V values;
the request names and the prefix keys are in ``kvstate.planner.kv_layout``.

Basic mode (Part 1; ``page_size == 1``, a core page is one token of every
layer): ``plan_reserve`` takes the reservation for the anchor,
``plan_basic_append`` shares the layer's next reserved page into its table,
``plan_basic_release`` closes and frees.

Paged mode (Parts 2 and 3; a core page is ``page_size`` tokens of one
layer): ``plan_paged_open`` takes the prompt's pages, ``plan_paged_append``
grows a table lazily and copies a shared page before writing into it,
``plan_open_with_prefix`` registers or reuses a retained prefix, and
``plan_paged_close`` closes, frees the request's own pages and releases its
prefix.  Copy-on-write: a write lands in place when its page has no other
holder, or when it is a prefix page and the position is inside the prefix
(the prefix's content, written once by the request that registered it); any
other write to a shared page first does ``Allocate``, ``Copy``, ``Assign``.

Policy: freed pages go to the head of the free list (reused first); a
shortfall evicts unlocked prefixes in SGLang's LRU order, only as many as
it takes, and only when that covers the shortfall.  ``phantom_pages`` is 1
when the budget holds no page at all: the geometry's one page is then never
handed out.
"""

from __future__ import annotations

from typing import Any

from kvstate.events import (
    Allocate,
    Append,
    Assign,
    Copy,
    Evict,
    Free,
    Insert,
    Lock,
    ReqAlloc,
    ReqFree,
    Share,
    Touch,
    Unlock,
)
from kvstate.planner.alloc import cdiv
from kvstate.planner.builder import Builder
from kvstate.planner.evict import eviction_order, freed_pages, lru_priority
from kvstate.planner.kv_layout import (
    anchor_name,
    core_names,
    find_prefix,
    layer_name,
    layer_pages,
    prefix_key,
    prefix_node_of,
    prefix_tokens_of,
)
from kvstate.state import DETACHED, ROOT, expand_pages


def usable_free_pages(state: Any, phantom_pages: int) -> int:
    """Free pages a plan may take."""
    return len(state.free_pages) - phantom_pages


def _eviction_for(state: Any, pages_needed: int, phantom_pages: int,
                  keep: int | None = None) -> tuple[int, ...] | None:
    """Nodes to evict (LRU) so ``pages_needed`` pages are free, or ``None`` if impossible.

    ``keep`` (a node about to be locked) ranks after every other candidate, so
    an order that reaches it means the others do not suffice.
    """
    deficit = pages_needed - usable_free_pages(state, phantom_pages)
    if deficit <= 0:
        return ()

    def priority(s: Any, node_id: int) -> tuple[int, Any]:
        return (1 if node_id == keep else 0, lru_priority(s, node_id))

    order = eviction_order(state, deficit * state.geometry.page_size, priority)
    if keep in order or freed_pages(state, order) < deficit:
        return None
    return tuple(order)


def _free_detached(b: Builder, pages: list[int]) -> None:
    """Free, at the head, those of ``pages`` that nobody holds any more."""
    holders = b.state.holders
    detached = tuple(dict.fromkeys(p for p in pages if holders.get(p) == (DETACHED,)))
    if detached:
        b.emit(Free(detached, at_head=True))


# -- basic mode ---------------------------------------------------------------------
def plan_reserve(b: Builder, request_id: str, num_layers: int, tokens: int,
                 phantom_pages: int) -> bool:
    """Open the request and reserve ``tokens`` pages for its anchor; False if they are not free.

    Emits ``ReqAlloc(anchor, L0.., )``, ``Allocate(pages, ((anchor, pages),))``.
    """
    state = b.state
    if anchor_name(request_id) in state.requests or tokens > usable_free_pages(state, phantom_pages):
        return False
    pages = tuple(state.free_pages.head(tokens))
    b.emit(ReqAlloc(core_names(request_id, num_layers)))
    b.emit(Allocate(pages, ((anchor_name(request_id), pages),)))
    return True


def plan_basic_append(b: Builder, request_id: str, layer: int) -> int | None:
    """Store the next token of ``layer``: its slot, or ``None`` when the reservation is full.

    Emits ``Share(L<layer>, position, (page,))`` of the next reserved page, ``Append``.
    """
    state = b.state
    anchor = state.requests[anchor_name(request_id)]
    table = layer_name(request_id, layer)
    position = state.requests[table].allocated
    if position >= anchor.allocated:
        return None
    slot = int(anchor.pages[position])
    b.emit(Share(table, position, (slot,)))
    b.emit(Append(((table, position + 1),)))
    return slot


def plan_basic_release(b: Builder, request_id: str, num_layers: int) -> None:
    """Close every core request of the seed request and free its reservation (at the head).

    Emits ``ReqFree(anchor, L0.., )``, ``Free(pages, at_head=True)``.
    """
    pages = list(b.state.requests[anchor_name(request_id)].pages)
    b.emit(ReqFree(core_names(request_id, num_layers)))
    _free_detached(b, pages)


# -- paged mode ---------------------------------------------------------------------
def _allocate_layers(b: Builder, request_id: str, num_layers: int, per_layer: int) -> None:
    """Append ``per_layer`` fresh whole pages to every layer table (one ``Allocate``)."""
    if per_layer == 0:
        return
    size = b.state.geometry.page_size
    fresh = b.state.free_pages.head(num_layers * per_layer)
    items = tuple((layer_name(request_id, layer),
                   expand_pages(fresh[layer * per_layer:(layer + 1) * per_layer], size))
                  for layer in range(num_layers))
    b.emit(Allocate(tuple(fresh), items))


def plan_paged_open(b: Builder, request_id: str, num_layers: int, prompt_tokens: int,
                    phantom_pages: int) -> bool:
    """``allocate_paged``: open with ``ceil(prompt / P)`` pages per layer; False if short.

    Emits ``ReqAlloc``, [``Evict``], ``Allocate(pages, per-layer items)``.
    """
    state = b.state
    per_layer = cdiv(prompt_tokens, state.geometry.page_size)
    if anchor_name(request_id) in state.requests:
        return False
    evict = _eviction_for(state, num_layers * per_layer, phantom_pages)
    if evict is None:
        return False
    b.emit(ReqAlloc(core_names(request_id, num_layers)))
    if evict:
        b.emit(Evict(evict, at_head=True))
    _allocate_layers(b, request_id, num_layers, per_layer)
    return True


def needs_copy(state: Any, table: str, page: int, position: int) -> bool:
    """Whether writing ``position`` of ``table`` into ``page`` must copy the page first."""
    node_id = state.page_node.get(page)
    if node_id is not None:
        return position >= prefix_tokens_of(state.nodes[node_id])
    return any(holder != table for holder in state.holders.get(page, ()))


def plan_paged_append(b: Builder, request_id: str, layer: int, phantom_pages: int) -> int | None:
    """Store the next token of one layer: the slot to write, or ``None`` if no page can be had.

    Emits, as needed, [``Evict``], a page for a full table (``Allocate``) or a
    private copy of a shared page (``Allocate``, ``Copy``, ``Assign``), then ``Append``.
    """
    state = b.state
    size = state.geometry.page_size
    table = layer_name(request_id, layer)
    record = state.requests[table]
    position = record.committed
    index = position // size
    growing = position >= record.allocated
    copying = not growing and needs_copy(state, table, record.pages[index], position)
    if growing or copying:
        evict = _eviction_for(state, 1, phantom_pages)
        if evict is None:
            return None
        if evict:
            b.emit(Evict(evict, at_head=True))
        (page,) = b.state.free_pages.head(1)
        if growing:
            b.emit(Allocate((page,), ((table, expand_pages((page,), size)),)))
        else:
            b.emit(Allocate((page,)))
            b.emit(Copy((record.pages[index],), (page,)))
            b.emit(Assign(table, index * size, expand_pages((page,), size)))
    else:
        page = record.pages[index]
    b.emit(Append(((table, position + 1),)))
    return int(page) * size + position % size


def plan_open_with_prefix(b: Builder, request_id: str, num_layers: int, prefix_hash: str,
                          prefix_tokens: int, unique_tokens: int,
                          phantom_pages: int) -> bool | None:
    """Open ``request_id`` on prefix ``prefix_hash``: True if it registered the prefix,
    False if it reused a retained one, ``None`` (no events) for an open id or too few pages.

    The caller checks that a retained ``prefix_hash`` has ``prefix_tokens`` tokens.
    Reuse emits ``ReqAlloc``, ``Touch``, ``Lock``, [``Evict``], ``Share(anchor)``,
    ``Share(L<l>)`` per layer, ``Append(prefix_tokens)``, [``Allocate(unique)``].
    Registration emits ``ReqAlloc``, [``Evict``], ``Allocate(prefix pages)``,
    ``Insert``, ``Lock``, the ``Share``s, [``Allocate(unique)``]; the request
    starts empty and its first ``prefix_tokens`` appends write the prefix.
    """
    state = b.state
    size = state.geometry.page_size
    prefix_pages = cdiv(prefix_tokens, size)
    unique_pages = cdiv(prefix_tokens + unique_tokens, size) - prefix_pages
    node_id = find_prefix(state, prefix_hash)
    registering = node_id is None
    needed = num_layers * (unique_pages + (prefix_pages if registering else 0))
    if anchor_name(request_id) in state.requests:
        return None
    evict = _eviction_for(state, needed, phantom_pages, keep=node_id)
    if evict is None:
        return None
    b.emit(ReqAlloc(core_names(request_id, num_layers)))
    if node_id is not None:
        b.emit(Touch((node_id,), b.state.clock + 1))
        b.emit(Lock(node_id))
    if evict:
        b.emit(Evict(evict, at_head=True))
    if node_id is None:
        fresh = tuple(b.state.free_pages.head(num_layers * prefix_pages))
        b.emit(Allocate(fresh))
        node_id = b.state.next_node_id
        b.emit(Insert(ROOT, prefix_key(prefix_hash, prefix_tokens, len(fresh) * size),
                      expand_pages(fresh, size), node_id, b.state.clock + 1, DETACHED))
        b.emit(Lock(node_id))
    node = b.state.nodes[node_id]
    b.emit(Share(anchor_name(request_id), 0, expand_pages(node.pages[:1], size)))
    for layer in range(num_layers):
        b.emit(Share(layer_name(request_id, layer), 0,
                     expand_pages(layer_pages(node, num_layers, layer), size)))
    if not registering:
        b.emit(Append(tuple((layer_name(request_id, layer), prefix_tokens)
                            for layer in range(num_layers))))
    _allocate_layers(b, request_id, num_layers, unique_pages)
    return registering


def plan_paged_close(b: Builder, request_id: str, num_layers: int) -> None:
    """``free``: close the request, free the pages only it held, release its prefix.

    Own pages go to the head of the free list in layer and table order; a
    prefix it used is stamped (LRU) and unlocked, and stays in the tree.
    Emits ``ReqFree``, [``Free``], [``Touch``, ``Unlock``].
    """
    state = b.state
    names = core_names(request_id, num_layers)
    node_id = prefix_node_of(state, names[0])
    pages = [page for name in names[1:] for page in state.requests[name].pages]
    b.emit(ReqFree(names))
    _free_detached(b, pages)
    if node_id is not None:
        b.emit(Touch((node_id,), b.state.clock + 1))
        b.emit(Unlock(node_id))
