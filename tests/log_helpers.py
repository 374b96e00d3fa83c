"""Event streams for the log and replay tests, made with the planner and the engine only.

The SGLang front end (``kvstate.workloads.synthetic``) may be mid-port, so the
log-layer tests make their workloads here: a seeded continuous-batching loop
in the planner's order (row, match, lock, prefix write, extend, decode,
release), and the SGLang API's order (``Allocate`` without items, then the
row write), whose prompt accounting must come out the same.  Deterministic
for a given seed.  Owned by the log/replay tests.
"""

from __future__ import annotations

import random

from kvstate.engine import Engine
from kvstate.events import Allocate, Assign, Event, Lock, ReqAlloc, ReqFree, Unlock
from kvstate.planner import plan_match
from kvstate.planner.alloc import plan_decode, plan_extend
from kvstate.planner.requests import RequestCursor, plan_release
from kvstate.state import ROOT, Geometry


def geometry_for(page_size: int = 4, capacity: int = 512, rows: int = 4) -> Geometry:
    return Geometry(num_pages=capacity // page_size, page_size=page_size, num_rows=rows,
                    row_width=256)


def planner_workload(requests: int = 30, seed: int = 0, page_size: int = 4, capacity: int = 512,
                     rows: int = 4, sglang_api: bool = False) -> tuple[Geometry, list[Event]]:
    """A seeded run with shared system prompts (prefix hits, splits, evictions).

    ``sglang_api``: admit as SGLang's objects do (``Allocate`` without items, then
    ``Assign`` of the new slots) instead of the planner's ``Allocate`` with items.
    """
    rng = random.Random(seed)
    geometry = geometry_for(page_size, capacity, rows)
    engine = Engine(geometry)
    systems = [[rng.randrange(1, 999) for _ in range(rng.randint(16, 48))] for _ in range(3)]
    at_head = page_size > 1
    running: list[tuple[RequestCursor, list[int], int]] = []
    waiting = requests
    while waiting or running:
        while waiting and len(running) < rows:
            prompt = rng.choice(systems) + [rng.randrange(1, 999) for _ in range(rng.randint(4, 24))]
            admitted = _admit(engine, prompt, at_head, sglang_api)
            if admitted is None:
                break
            waiting -= 1
            running.append((admitted, prompt, rng.randint(1, 12)))
        if not running:
            break
        with engine.batch() as b:
            slots = plan_decode(b, [c.request for c, _, _ in running], at_head=at_head)
        finished = [item for item in running if slots is None or item[2] <= 1]
        running = [(c, p, left - 1) for c, p, left in running if (c, p, left) not in finished]
        for cursor, prompt, _ in finished:
            owned = engine.view.requests[cursor.request].committed
            tokens = prompt + [7] * max(0, owned - len(prompt))
            with engine.batch() as b:
                plan_release(b, cursor, tokens[:owned], prompt_len=len(prompt), owned=owned,
                             checkpoint=True, at_head=at_head)
    return geometry, list(engine.events)


def _admit(engine: Engine, prompt: list[int], at_head: bool,
           sglang_api: bool) -> RequestCursor | None:
    free_rows = engine.view.free_rows.head(1)
    if not free_rows:
        return None
    row = free_rows[0]
    engine.apply(ReqAlloc((row,)))
    with engine.batch() as b:
        match = plan_match(b, prompt[:-1])
    if match.last_node != ROOT:
        engine.apply(Lock(match.last_node))
    if match.slots:
        engine.apply(Assign(row, 0, tuple(match.slots)))
    if sglang_api:
        fresh = _sglang_extend(engine, row, len(prompt))
    else:
        with engine.batch() as b:
            fresh = plan_extend(b, [(row, len(prompt))], at_head=at_head)
    if fresh is None:
        if match.last_node != ROOT:
            engine.apply(Unlock(match.last_node))
        engine.apply(ReqFree((row,)))
        return None
    return RequestCursor(row, len(match.slots), match.last_node)


def _sglang_extend(engine: Engine, row: int, length: int) -> list[int] | None:
    """``allocator.alloc`` (detached pages) then ``pool.write`` of their slots, as SGLang does."""
    from kvstate.events import Append

    state = engine.view
    size = state.geometry.page_size
    have = state.requests[row].allocated
    if have % size:
        return None  # keep the example simple: only page-aligned prefixes
    need = -(-(length - have) // size)
    pages = state.free_pages.head(need)
    if len(pages) < need:
        return None
    engine.apply(Allocate(tuple(pages)))
    slots = tuple(p * size + i for p in pages for i in range(size))[: length - have]
    engine.apply(Assign(row, have, slots))
    engine.apply(Append(((row, length),)))
    return list(slots)


# -- hypothesis strategies from the event classes' own msgspec types ----------------------
def value_strategy(info: object, small: int | None = None):  # noqa: ANN201 - a strategy
    """Every valid value of one msgspec field type (ranges included); ``small`` caps the
    ints at that value, so the events name pages, rows and nodes that may exist."""
    from hypothesis import strategies as st
    from msgspec import inspect as mi

    if isinstance(info, mi.IntType):
        low = -(2**63) if info.ge is None else info.ge
        high = 2**63 - 1 if info.le is None else info.le
        if small is not None:
            high = min(high, small)
        return st.integers(low, high)
    if isinstance(info, mi.StrType):
        return st.text(max_size=min(info.max_length or 8, 8))
    if isinstance(info, mi.BoolType):
        return st.booleans()
    if isinstance(info, mi.NoneType):
        return st.none()
    if isinstance(info, mi.LiteralType):
        return st.sampled_from(info.values)
    if isinstance(info, mi.UnionType):
        return st.one_of([value_strategy(t, small) for t in info.types])
    if isinstance(info, mi.TupleType):
        return st.tuples(*(value_strategy(t, small) for t in info.item_types))
    if isinstance(info, mi.VarTupleType):
        return st.lists(value_strategy(info.item_type, small), max_size=4).map(tuple)
    raise TypeError(f"no strategy for {info!r}")


def event_strategy(classes=None, small=None):  # noqa: ANN001, ANN201
    """Events of every registered class (or ``classes``) with any valid field values
    (ints capped at ``small`` when given)."""
    from hypothesis import strategies as st
    from msgspec import inspect as mi

    from kvstate.events import EVENT_TYPES

    out = []
    for cls in classes or EVENT_TYPES.values():
        fields = mi.type_info(cls).fields
        out.append(st.tuples(*(value_strategy(f.type, small) for f in fields)).map(
            lambda values, cls=cls: cls(*values)))
    return st.one_of(out)
