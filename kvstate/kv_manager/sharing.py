"""``allocate_with_prefix`` planning: reuse or register a retained prefix.  Pure.

Reuse (the hash names a prefix node)::

    ReqAlloc(req/<id>, L0/<id> .. )      open the anchor and the layer tables
    Touch(node), Lock(node)              LRU stamp; the lock keeps it from eviction
    [Evict(...)]                         only if the unique part is short of pages
    Share(req/<id>, 0, node's first page)      the anchor's record of the prefix
    Share(L<l>/<id>, 0, layer l's prefix pages) for every layer (refcount + 1)
    Append(L<l>/<id> -> prefix_tokens)   the prefix counts as stored
    Allocate(unique pages, per layer)    only positions past the prefix's pages

Register (a new hash): ``Allocate`` the prefix pages bare, ``Insert`` them as
a node (the tree becomes their holder), then as above except that the
request's tables start empty: the registering request writes the prefix's
content with its first ``prefix_tokens`` appends.

Unique tokens that fit in the prefix's partial last page take no page here;
the first write there copies that page (copy-on-write, see ``paged.py``).
The plan's result is True when it registered a new prefix (the manager
then zeroes the prefix pages in the value store); the planner returns
``None`` (no events) when the pages cannot be had even after evicting every
other unlocked prefix.
"""

from __future__ import annotations

from kvstate.events import Allocate, Append, Insert, Lock, ReqAlloc, Share, Touch
from kvstate.kv_manager.names import anchor_name, core_names, layer_name
from kvstate.kv_manager.paged import allocate_layers, cdiv, ensure_free, page_slots
from kvstate.kv_manager.prefix import layer_pages, prefix_key
from kvstate.planner.builder import Plan, PlanBuilder
from kvstate.state import DETACHED, ROOT, State


def plan_open_with_prefix(state: State, request_id: str, num_layers: int, prefix_hash: str,
                          prefix_tokens: int, unique_tokens: int, node_id: int | None,
                          phantom_pages: int) -> Plan[bool] | None:
    """Open ``request_id`` on prefix ``prefix_hash`` (node ``node_id`` if already retained)."""
    size = state.geometry.page_size
    prefix_pages = cdiv(prefix_tokens, size)
    unique_pages = cdiv(prefix_tokens + unique_tokens, size) - prefix_pages
    registered = node_id is None
    builder = PlanBuilder(state)
    builder.emit(ReqAlloc(core_names(request_id, num_layers)))
    if node_id is not None:
        builder.emit(Touch((node_id,), builder.state.clock + 1))
        builder.emit(Lock(node_id))
        if not ensure_free(builder, num_layers * unique_pages, phantom_pages):
            return None
    else:
        if not ensure_free(builder, num_layers * (prefix_pages + unique_pages), phantom_pages):
            return None
        fresh = tuple(builder.state.free_pages.head(num_layers * prefix_pages))
        builder.emit(Allocate(fresh))
        node_id = builder.state.next_node_id
        builder.emit(Insert(ROOT, prefix_key(prefix_hash, prefix_tokens, len(fresh) * size),
                            page_slots(fresh, size), node_id, builder.state.clock + 1, DETACHED))
        builder.emit(Lock(node_id))
    node = builder.state.nodes[node_id]
    builder.emit(Share(anchor_name(request_id), 0, page_slots(node.pages[:1], size)))
    for layer in range(num_layers):
        builder.emit(Share(layer_name(request_id, layer), 0,
                           page_slots(layer_pages(node, num_layers, layer), size)))
    if not registered:
        builder.emit(Append(tuple((layer_name(request_id, layer), prefix_tokens)
                                  for layer in range(num_layers))))
    allocate_layers(builder, request_id, num_layers, unique_pages)
    return builder.done(registered)
