"""Paged-mode planning: per-layer page tables, lazy growth, copy-on-write (Parts 2, 3).

Pure: ``(state, call) -> Plan``; nothing here mutates or imports torch.

Geometry: one core page is ``page_size`` tokens of K and V for *one* layer
(``page_size * num_kv_heads * (head_dim + v_head_dim) * dtype_bytes`` bytes),
so the page count is exactly ``max_gpu_memory_bytes // page_bytes``.  Each
layer of a seed request is its own core request ``L<l>/<id>`` whose table
maps whole pages (``allocated`` is always a page multiple) and whose
``committed`` length is the number of tokens stored in that layer::

    positions  0 ........ prefix_tokens ..... committed ....... allocated
               | shared prefix pages | own pages, written | own, still empty |

Page holders: an own page is held by its layer table alone; a prefix page
by the tree node of the prefix plus every layer table (and anchor) that
shares it.  A write lands in place when the page has no other holder, or
when it is a prefix page and the position is inside the prefix (that is the
prefix's content, written once by the request that registered it).  Any
other write to a shared page first copies it: ``Allocate`` a page,
``Copy`` old -> new, ``Assign`` the new page over the old one in this table.
Shortfalls evict unlocked prefix nodes in LRU order first.
"""

from __future__ import annotations

from kvstate.errors import OutOfMemory
from kvstate.events import Allocate, Append, Assign, Copy, Free, ReqAlloc, ReqFree, Touch, Unlock
from kvstate.kv_manager.basic import usable_free_pages
from kvstate.kv_manager.names import anchor_name, core_names, layer_name
from kvstate.kv_manager.prefix import prefix_node_of, prefix_tokens_of
from kvstate.planner.builder import Plan, PlanBuilder
from kvstate.planner.evict import lru_priority, plan_evict
from kvstate.state import DETACHED, State


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def page_slots(pages: tuple[int, ...] | list[int], page_size: int) -> tuple[int, ...]:
    return tuple(page * page_size + offset for page in pages for offset in range(page_size))


def ensure_free(builder: PlanBuilder, pages_needed: int, phantom_pages: int) -> bool:
    """Evict unlocked prefixes (LRU) until ``pages_needed`` pages are free; False if impossible."""
    available = usable_free_pages(builder.state, phantom_pages)
    if pages_needed <= available:
        return True
    size = builder.state.geometry.page_size
    builder.extend(plan_evict(builder.state, (pages_needed - available) * size,
                              at_head=True, priority=lru_priority))
    return pages_needed <= usable_free_pages(builder.state, phantom_pages)


def allocate_layers(builder: PlanBuilder, request_id: str, num_layers: int,
                    pages_per_layer: int) -> None:
    """Append ``pages_per_layer`` fresh whole pages to every layer table (one Allocate)."""
    if pages_per_layer == 0:
        return
    size = builder.state.geometry.page_size
    fresh = builder.state.free_pages.head(num_layers * pages_per_layer)
    items = tuple(
        (layer_name(request_id, layer),
         page_slots(fresh[layer * pages_per_layer:(layer + 1) * pages_per_layer], size))
        for layer in range(num_layers))
    builder.emit(Allocate(tuple(fresh), items))


def plan_open(state: State, request_id: str, num_layers: int, prompt_tokens: int,
              phantom_pages: int) -> Plan[bool] | None:
    """``allocate_paged``: open the request with the prompt's pages; ``None`` if short."""
    per_layer = cdiv(prompt_tokens, state.geometry.page_size)
    builder = PlanBuilder(state)
    builder.emit(ReqAlloc(core_names(request_id, num_layers)))
    if not ensure_free(builder, num_layers * per_layer, phantom_pages):
        return None
    allocate_layers(builder, request_id, num_layers, per_layer)
    return builder.done(True)


def needs_copy(state: State, table: str, page: int, position: int) -> bool:
    """Whether writing ``position`` of ``table`` into ``page`` must copy the page first."""
    node_id = state.page_node.get(page)
    if node_id is not None:
        return position >= prefix_tokens_of(state.nodes[node_id])
    return any(holder != table for holder in state.holders.get(page, ()))


def plan_append(state: State, request_id: str, layer: int, phantom_pages: int) -> Plan[int]:
    """Store the next token of one layer; the result is the slot to write.

    Emits (in order, as needed): a page for a full table (``Allocate``), or a
    private copy of a shared page (``Allocate``, ``Copy``, ``Assign``), then
    ``Append``.  Raises ``OutOfMemory`` (no events) when no page can be had.
    """
    size = state.geometry.page_size
    table = layer_name(request_id, layer)
    record = state.requests[table]
    position = record.committed
    builder = PlanBuilder(state)
    if position < record.allocated:
        index = position // size
        page = record.pages[index]
        if needs_copy(state, table, page, position):
            if not ensure_free(builder, 1, phantom_pages):
                raise OutOfMemory(1, 0, "pages")
            (fresh,) = builder.state.free_pages.head(1)
            builder.emit(Allocate((fresh,)))
            builder.emit(Copy((page,), (fresh,)))
            builder.emit(Assign(table, index * size, page_slots((fresh,), size)))
            page = fresh
    else:
        if not ensure_free(builder, 1, phantom_pages):
            raise OutOfMemory(1, 0, "pages")
        (page,) = builder.state.free_pages.head(1)
        builder.emit(Allocate((page,), ((table, page_slots((page,), size)),)))
    builder.emit(Append(((table, position + 1),)))
    return builder.done(page * size + position % size)


def plan_close(state: State, request_id: str, num_layers: int) -> Plan[None]:
    """``free``: close the request, free the pages only it held, release its prefix.

    Own pages go to the head of the free list in layer and table order.  A
    prefix it used is stamped (LRU) and unlocked; it stays in the tree.
    """
    names = core_names(request_id, num_layers)
    node_id = prefix_node_of(state, anchor_name(request_id))
    pages = [page for name in names[1:] for page in state.requests[name].pages]
    builder = PlanBuilder(state)
    builder.emit(ReqFree(names))
    holders = builder.state.holders
    detached = tuple(dict.fromkeys(p for p in pages if holders.get(p) == (DETACHED,)))
    if detached:
        builder.emit(Free(detached, at_head=True))
    if node_id is not None:
        builder.emit(Touch((node_id,), builder.state.clock + 1))
        builder.emit(Unlock(node_id))
    return builder.done(None)
