"""The refinement mapping: ``abstract(state) -> specs.model.ModelState``.

``state`` is a frozen ``State`` or a ``LiveState`` (both have the same
attribute names).  It forgets what the model derives (children indexes,
``page_node``, ``leaves``, ``tree_refs``, each node's ``below``, the
evictable/protected counters, ``seq``, the host-only child index) and keeps
everything that decides future behaviour.  Radix-mode holders become sets
(their order never matters); in block mode the anonymous pool references
(``DETACHED`` entries, which may repeat) become a count per page.  Free
lists and the free-row stack keep their order (it decides reuse).  Read-only.
"""

from __future__ import annotations

from typing import Any

from specs.model import MNode, ModelHost, ModelState, MRequest, initial_model


def _is_pool(holder: Any) -> bool:
    return holder == 0 and isinstance(holder, int)


def abstract(state: Any) -> ModelState:
    geometry = state.geometry
    block = geometry.mode == "block"
    pool: dict[int, int] = {}
    if block:
        holders: dict[int, set[Any]] = {}
        for page, held in state.holders.items():
            count = sum(1 for h in held if _is_pool(h))
            if count:
                pool[page] = count
            requests = {h for h in held if not _is_pool(h)}
            if requests:
                holders[page] = requests
    else:
        holders = {page: set(held) for page, held in state.holders.items()}
    host = None
    if state.host is not None:
        tier = state.host
        host = ModelHost(tier.num_pages, list(tier.free_pages),
                         {n: list(p) for n, p in tier.backup.items()},
                         {n: (h.parent, tuple(h.key), h.last_access)
                          for n, h in tier.evicted.items()})
    return ModelState(
        num_pages=geometry.num_pages,
        page_size=geometry.page_size,
        num_rows=geometry.num_rows,
        row_width=geometry.row_width,
        mode=geometry.mode,
        clock=state.clock,
        next_node=state.next_node_id,
        free=list(state.free_pages),
        holders=holders,
        free_rows=list(state.free_rows),
        generation=dict(state.row_generation.items()),
        requests={rid: MRequest(list(r.pages), r.allocated, r.committed, list(r.dangling))
                  for rid, r in state.requests.items()},
        nodes={nid: MNode(n.parent, tuple(n.key), list(n.pages), n.lock_ref, n.last_access,
                          n.extra)
               for nid, n in state.nodes.items()},
        pool=pool,
        host=host,
    )


def abstract_any(state: Any) -> Any:
    """``abstract`` of any state: with a Mamba pool ``specs.model_mamba.abstract_mamba``
    (a ``MambaModel``), with an SWA pool ``specs.model_swa.abstract_hybrid`` (a
    ``HybridModel``), else the core ``ModelState``."""
    if getattr(state, "mamba", None) is not None:
        from specs.model_mamba import abstract_mamba

        return abstract_mamba(state)
    if getattr(state, "swa", None) is not None:
        from specs.model_swa import abstract_hybrid

        return abstract_hybrid(state)
    return abstract(state)


def model_of_geometry(state: Any) -> ModelState:
    """The model's initial state for ``state``'s geometry (and host tier size)."""
    g = state.geometry
    host_pages = 0 if state.host is None else state.host.num_pages
    return initial_model(g.num_pages, g.page_size, g.num_rows, g.row_width, g.mode, host_pages)


def diff(a: Any, b: Any) -> list[str]:
    """Field names where two model states differ (for readable failures); a hybrid's
    parts are named ``part.field`` (``core.free``, ``swa.peer``, ``mamba.held``)."""
    out = []
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if x != y:
            inner = diff(x, y) if hasattr(x, "__dataclass_fields__") and type(x) is type(y) \
                else []
            out += [f"{name}.{n}" for n in inner] if inner else [name]
    return out


def agrees(state: Any, model: ModelState) -> bool:
    """``abstract(state) == model``, without building the abstraction (the explorer's hot path).

    Compares field by field, cheapest first, and stops at the first difference; it reads
    the same fields ``abstract`` keeps, so the two always give the same answer (tests
    check this on every state of the pinned scopes).
    """
    geometry = state.geometry
    if (state.clock != model.clock or state.next_node_id != model.next_node
            or (geometry.num_pages, geometry.page_size, geometry.num_rows, geometry.row_width,
                geometry.mode) != (model.num_pages, model.page_size, model.num_rows,
                                   model.row_width, model.mode)):
        return False
    if len(state.requests) != len(model.requests) or len(state.nodes) != len(model.nodes):
        return False
    for rid, record in state.requests.items():
        wanted_record = model.requests.get(rid)
        if wanted_record is None or not _same_record("requests", record, wanted_record):
            return False
    for nid, node in state.nodes.items():
        wanted_node = model.nodes.get(nid)
        if wanted_node is None or not _same_record("nodes", node, wanted_node):
            return False
    if geometry.mode == "block" or state.host is not None:
        return abstract(state) == model  # the rarer shapes: compare the whole abstraction
    holders = state.holders
    if len(holders) != len(model.holders) or model.pool:
        return False
    for page, held in holders.items():
        wanted = model.holders.get(page)
        if wanted is None or len(held) != len(wanted) or not wanted.issuperset(held):
            return False
    return (list(state.free_pages) == model.free and list(state.free_rows) == model.free_rows
            and dict(state.row_generation.items()) == model.generation and model.host is None)


def agrees_step(before: Any, model_before: ModelState, after: Any,
                model_after: ModelState) -> bool:
    """``abstract(after) == model_after``, given ``abstract(before) == model_before``.

    The rules' persistent states share every container and record an event did not
    change, so where ``after`` holds the very object ``before`` held, its abstraction is
    ``model_before``'s: the model must then have left that part unchanged too.  The rest
    is compared as ``agrees`` does.  Block-mode and host-tier states use ``agrees``.
    """
    if after.geometry.mode == "block" or after.host is not None:
        return agrees(after, model_after)
    if (after.clock != model_after.clock or after.next_node_id != model_after.next_node
            or after.geometry is not before.geometry or model_after.pool or model_after.host):
        return False
    records: tuple[tuple[str, Any, Any, dict[Any, Any], dict[Any, Any]], ...] = (
        ("requests", before.requests, after.requests, model_before.requests,
         model_after.requests),
        ("nodes", before.nodes, after.nodes, model_before.nodes, model_after.nodes))
    for name, old_map, new_map, old_model, new_model in records:
        if len(new_map) != len(new_model):
            return False
        for key, record in new_map.items():
            wanted_record = new_model.get(key)
            if wanted_record is None:
                return False
            if old_map.get(key) is record:
                if wanted_record != old_model[key]:
                    return False
            elif not _same_record(name, record, wanted_record):
                return False
    for old_queue, new_queue, old_order, new_order in (
            (before.free_pages, after.free_pages, model_before.free, model_after.free),
            (before.free_rows, after.free_rows, model_before.free_rows, model_after.free_rows)):
        if new_queue is old_queue:
            if new_order != old_order:
                return False
        elif list(new_queue) != new_order:
            return False
    if after.row_generation is before.row_generation:
        if model_after.generation != model_before.generation:
            return False
    elif dict(after.row_generation.items()) != model_after.generation:
        return False
    holders, wanted_holders = after.holders, model_after.holders
    if holders is before.holders:
        return wanted_holders == model_before.holders
    if len(holders) != len(wanted_holders):
        return False
    for page, held in holders.items():
        wanted = wanted_holders.get(page)
        if wanted is None or len(held) != len(wanted) or not wanted.issuperset(held):
            return False
    return True


def _same_record(kind: str, record: Any, wanted: Any) -> bool:
    if kind == "requests":
        return (record.allocated == wanted.allocated and record.committed == wanted.committed
                and list(record.pages) == wanted.pages and list(record.dangling) == wanted.dangling)
    return (record.parent == wanted.parent and tuple(record.key) == wanted.key
            and list(record.pages) == wanted.pages and record.lock_ref == wanted.lock_ref
            and record.last_access == wanted.last_access and record.extra == wanted.extra)
