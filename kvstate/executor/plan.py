"""Index planning for the executor: ``plan_indices(before, event) -> IndexPlan``.

Pure (no torch, no clock, no randomness): reads the state an event applies
to (a frozen ``State`` or the engine's ``LiveState``; only the shared
attribute names) and the event, and returns plain index lists saying which
bytes an executor must move and which token positions change meaning.  The
effect of an event is determined by the pre-state and the event, so no
post-state is needed: the engine's listener calls this in ``before`` and the
executor moves the bytes once the batch is committed.  A plan copies what it
takes from the state (the live state goes on changing).  The executor and
the integrity monitor act on plans; they never decide.

The fields are described in :mod:`kvstate.executor.index_plan`.

Which events move bytes: ``Copy`` (copy_*), ``Free``/``FreeMapped``/``Evict``/
``Reset`` and the block releases (freed_slots, poisoned in debug mode),
``Offload``/``Load`` (host_*).  Row and tree events only change meaning.
Block-mode events are planned in :mod:`kvstate.executor.plan_block`, host
events in :mod:`kvstate.executor.plan_host`, tree events in
:mod:`kvstate.executor.plan_tree`, SWA-pool events (and the SWA part of a
``Copy`` or a ``Reset``) in :mod:`kvstate.executor.plan_swa`, Mamba-pool events in
:mod:`kvstate.executor.plan_mamba`.  Every field is a tuple; an event that
moves nothing and changes no meaning gets ``EMPTY_PLAN``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.events import (
    Allocate,
    Assign,
    Copy,
    Event,
    Free,
    FreeMapped,
    ReqAlloc,
    ReqFree,
    Scatter,
    Share,
    Truncate,
)
from kvstate.executor.index_plan import EMPTY_PLAN, PLANNERS, IndexPlan, TokenRef, page_slots, plans
from kvstate.executor.plan_swa import swa_copy_part
from kvstate.state import DETACHED, RequestId


def plan_indices(before: Any, event: Event) -> IndexPlan:
    """The index lists of ``event`` applied to ``before`` (a ``State`` or ``LiveState``; pure).

    ``before`` must be a state the event is valid for (the rules are not
    re-checked here); events without a planner move nothing.
    """
    planner = PLANNERS.get(type(event))
    return EMPTY_PLAN if planner is None else planner(before, event)



# -- rows ---------------------------------------------------------------------
@plans(ReqAlloc)
def _req_alloc(before: Any, event: ReqAlloc) -> IndexPlan:
    return IndexPlan(opened=event.requests)


@plans(ReqFree)
def _req_free(before: Any, event: ReqFree) -> IndexPlan:
    return IndexPlan(closed=event.requests)


@plans(Truncate)
def _truncate(before: Any, event: Truncate) -> IndexPlan:
    return IndexPlan(truncated=((event.request, event.length),))


# -- pages ----------------------------------------------------------------------
@plans(Allocate)
def _allocate(before: Any, event: Allocate) -> IndexPlan:
    if not event.items:
        return EMPTY_PLAN  # DETACHED pages: nobody maps them, their bytes are garbage
    tokens: list[TokenRef] = []
    lengths: dict[RequestId, int] = {}  # an item may follow another item of the same request
    requests = before.requests
    for request_id, slots in event.items:
        start = lengths.get(request_id)
        if start is None:
            start = requests[request_id].allocated
        tokens.extend(zip([request_id] * len(slots), range(start, start + len(slots)), slots,
                          strict=True))
        lengths[request_id] = start + len(slots)
    return IndexPlan(new_tokens=tuple(tokens))


def _table_write(before: Any, request_id: RequestId, start: int, slots: Sequence[int],
                 new: list[TokenRef], linked: list[TokenRef]) -> None:
    """Classify the positions a row write changes: computed fresh (``new``) or linked.

    A position keeps its meaning when it maps the same slot as before and
    its entry is not dangling.  A fresh position (past the mapped length, or
    a dangling entry) on a DETACHED page or on a page the request holds alone
    outside the tree is computed by the forward pass; anything else reads KV
    already in the pool (a tree page, a page the request moved).
    """
    size = before.geometry.page_size
    record = before.requests[request_id]
    pages, allocated, dangling = record.pages, record.allocated, record.dangling
    holders, page_node = before.holders, before.page_node
    own = (request_id,)
    for position, slot in zip(range(start, start + len(slots)), slots, strict=True):
        page, index = slot // size, position // size
        fresh = position >= allocated or index in dangling
        if not fresh and pages[index] == page:
            continue  # rewritten with the slot it already maps
        held = holders.get(page)
        if page not in page_node and (held == (DETACHED,) or (fresh and held == own)):
            new.append((request_id, position, slot))
        else:
            linked.append((request_id, position, slot))


@plans(Assign)
def _assign(before: Any, event: Assign) -> IndexPlan:
    new: list[TokenRef] = []
    linked: list[TokenRef] = []
    _table_write(before, event.request, event.start, event.slots, new, linked)
    return IndexPlan(new_tokens=tuple(new), linked_tokens=tuple(linked))


@plans(Scatter)
def _scatter(before: Any, event: Scatter) -> IndexPlan:
    new: list[TokenRef] = []
    linked: list[TokenRef] = []
    for request_id, position, slot in event.items:  # distinct requests: items are independent
        _table_write(before, request_id, position, (slot,), new, linked)
    return IndexPlan(new_tokens=tuple(new), linked_tokens=tuple(linked))


@plans(Share)
def _share(before: Any, event: Share) -> IndexPlan:
    start = event.start
    return IndexPlan(linked_tokens=tuple(zip([event.request] * len(event.slots),
                                             range(start, start + len(event.slots)), event.slots,
                                             strict=True)))


@plans(Free)
def _free(before: Any, event: Free) -> IndexPlan:
    return IndexPlan(freed_slots=page_slots(event.pages, before.geometry.page_size))


@plans(FreeMapped)
def _free_mapped(before: Any, event: FreeMapped) -> IndexPlan:
    """The pages are freed; every row entry that maps one of them becomes dangling."""
    size = before.geometry.page_size
    gone = set(event.pages)
    owners = dict.fromkeys(before.holders[page][0] for page in event.pages)
    dangled: list[TokenRef] = []
    for request_id in owners:
        record = before.requests[request_id]
        for index, page in enumerate(record.pages):
            if page in gone:
                first = index * size
                for position in range(first, min(first + size, record.allocated)):
                    dangled.append((request_id, position, page * size + position - first))
    return IndexPlan(freed_slots=page_slots(event.pages, size), dangled_tokens=tuple(dangled))


@plans(Copy)
def _copy(before: Any, event: Copy) -> IndexPlan:
    size = before.geometry.page_size
    swa = swa_copy_part(before, event.src_pages, event.dst_pages)
    return IndexPlan(copy_src=page_slots(event.src_pages, size),
                     copy_dst=page_slots(event.dst_pages, size), **swa)


# Register the other planners (imported for their side effect on PLANNERS).
from kvstate.executor import plan_block, plan_host, plan_mamba, plan_swa, plan_tree  # noqa: E402,F401,I001
