"""The seed-002 planner (``kvstate.planner.kv_manager``) on its own: pure, no torch.

Each test drives the ``plan_*`` functions with a ``PlanBuilder`` (or an
engine batch) and checks the events: a refusal emits nothing at all (so an
engine batch around it commits nothing), and every emitted event validates
against the event format, so a recorded run can be decoded again.
"""

from __future__ import annotations

from kvstate import Engine, Geometry, apply_all, check, initial_state
from kvstate.events import (
    MAX_ID,
    Allocate,
    Append,
    Assign,
    Copy,
    Evict,
    Insert,
    Lock,
    ReqAlloc,
    Share,
    Touch,
    validated,
)
from kvstate.planner import PlanBuilder
from kvstate.planner.kv_layout import find_prefix, prefix_code
from kvstate.planner.kv_manager import (
    plan_basic_append,
    plan_basic_release,
    plan_open_with_prefix,
    plan_paged_append,
    plan_paged_close,
    plan_paged_open,
    plan_reserve,
)

LAYERS = 2


def paged_state(pages: int, page_size: int = 4):
    return initial_state(Geometry(num_pages=pages, page_size=page_size, row_width=pages * page_size))


def run(state, plan, *args):
    """Apply one planner call to ``state``: (result, events, new state)."""
    b = PlanBuilder(state)
    result = plan(b, *args)
    done = b.done(result)
    return result, done.events, done.state


def test_basic_reserve_append_release_round_trip():
    state = initial_state(Geometry(num_pages=6, row_width=6))
    ok, events, state = run(state, plan_reserve, "a", LAYERS, 4, 0)
    assert ok and [type(e) for e in events] == [ReqAlloc, Allocate]
    slot, events, state = run(state, plan_basic_append, "a", 1)
    assert events == (Share("L1/a", 0, (slot,)), Append((("L1/a", 1),)))
    for _ in range(3):
        _, _, state = run(state, plan_basic_append, "a", 1)
    full, events, state = run(state, plan_basic_append, "a", 1)
    assert full is None and events == ()  # the reservation is full: nothing emitted
    _, events, state = run(state, plan_basic_release, "a", LAYERS)
    assert len(state.free_pages) == 6 and check(state) == []


def test_refusals_emit_nothing():
    state = initial_state(Geometry(num_pages=3, row_width=3))
    assert run(state, plan_reserve, "a", LAYERS, 4, 0)[:2] == (False, ())
    assert run(state, plan_reserve, "a", LAYERS, 3, 1)[:2] == (False, ())  # one phantom page
    _, _, state = run(state, plan_reserve, "a", LAYERS, 1, 0)
    assert run(state, plan_reserve, "a", LAYERS, 1, 0)[:2] == (False, ())  # open id
    paged = paged_state(4)
    assert run(paged, plan_paged_open, "a", LAYERS, 9, 0)[:2] == (False, ())
    assert run(paged, plan_open_with_prefix, "a", LAYERS, "h", 8, 1, 0)[:2] == (None, ())


def test_a_short_open_evicts_nothing_even_when_some_eviction_is_possible():
    state = paged_state(6)
    _, _, state = run(state, plan_open_with_prefix, "a", LAYERS, "h", 4, 0, 0)  # 2 pages
    _, _, state = run(state, plan_paged_close, "a", LAYERS)  # retained, evictable
    result, events, _ = run(state, plan_paged_open, "b", LAYERS, 16, 0)  # 8 pages > 4 + 2
    assert (result, events) == (False, ())
    result, events, state = run(state, plan_paged_open, "b", LAYERS, 12, 0)  # 6 = 4 + 2
    assert result and [type(e) for e in events] == [ReqAlloc, Evict, Allocate]
    assert find_prefix(state, "h") is None and check(state) == []


def test_reuse_never_evicts_the_prefix_it_reuses():
    state = paged_state(6)
    _, _, state = run(state, plan_open_with_prefix, "a", LAYERS, "h", 4, 0, 0)
    _, _, state = run(state, plan_paged_close, "a", LAYERS)
    _, _, state = run(state, plan_paged_open, "x", LAYERS, 4, 0)  # 2 pages left free
    # Reusing "h" needs 4 unique pages: only evicting "h" itself would free them.
    assert run(state, plan_open_with_prefix, "b", LAYERS, "h", 4, 8, 0)[:2] == (None, ())
    result, events, state = run(state, plan_open_with_prefix, "b", LAYERS, "h", 4, 4, 0)
    assert result is False  # reused, not registered
    assert [type(e) for e in events[:3]] == [ReqAlloc, Touch, Lock]
    assert not any(isinstance(e, Evict) for e in events) and check(state) == []


def test_paged_append_grows_copies_and_refuses_without_a_page():
    state = paged_state(5)
    _, _, state = run(state, plan_open_with_prefix, "a", LAYERS, "h", 3, 0, 0)  # 1 page/layer
    for _ in range(3):
        _, _, state = run(state, plan_paged_append, "a", 0, 0)  # the prefix, in place
    _, _, state = run(state, plan_open_with_prefix, "b", LAYERS, "h", 3, 1, 0)
    slot, events, state = run(state, plan_paged_append, "b", 0, 0)  # position 3: shared page
    assert [type(e) for e in events] == [Allocate, Copy, Assign, Append]
    assert slot == events[0].pages[0] * 4 + 3
    _, events, state = run(state, plan_paged_append, "a", 0, 0)  # a copies too (2 -> 1 free)
    assert [type(e) for e in events] == [Allocate, Copy, Assign, Append]
    _, events, state = run(state, plan_paged_append, "a", 0, 0)  # a new page (1 -> 0 free)
    assert [type(e) for e in events] == [Allocate, Append] and len(state.free_pages) == 0
    assert run(state, plan_paged_append, "b", 1, 0)[:2] == (None, ())  # b's copy: no page
    _, events, state = run(state, plan_paged_append, "a", 1, 0)  # prefix content: in place
    assert [type(e) for e in events] == [Append]
    assert check(state) == []


def test_every_emitted_event_validates_and_replays():
    # Regression: the prefix code was a 64-bit hash, so an Insert key could exceed
    # int64 and a recorded log failed to decode.  "sys" hashes above 2**63.
    assert prefix_code("sys") <= MAX_ID
    state = paged_state(12)
    start = state
    events = []
    for call in [(plan_open_with_prefix, "a", LAYERS, "sys", 6, 2, 0),
                 *[(plan_paged_append, "a", layer, 0) for layer in (0, 1) for _ in range(8)],
                 (plan_open_with_prefix, "b", LAYERS, "sys", 6, 1, 0),
                 (plan_paged_append, "b", 0, 0), (plan_paged_close, "a", LAYERS),
                 (plan_paged_close, "b", LAYERS), (plan_paged_open, "c", LAYERS, 24, 0)]:
        _, emitted, state = run(state, *call)
        events.extend(emitted)
    assert all(validated(e) == e for e in events)
    assert {Insert, Copy, Evict} <= {type(e) for e in events}
    assert apply_all(start, events) == state and check(state) == []


def test_planners_emit_straight_into_an_engine_batch():
    engine = Engine(Geometry(num_pages=4, page_size=2, row_width=8))
    with engine.batch() as b:
        assert plan_paged_open(b, "a", LAYERS, 3, 0)
    seq = engine.seq
    with engine.batch() as b:
        assert not plan_paged_open(b, "b", LAYERS, 1, 0)  # no page left: nothing applied
    assert engine.seq == seq and check(engine.state) == []
