"""The engine: both backends, batches, listeners, freezing and self-verification."""

from __future__ import annotations

import pytest

from kvstate import Engine, InvalidEvent, check
from kvstate import events as ev
from kvstate.errors import EngineBroken, ListenerError, VerificationError
from kvstate.planner import plan_insert, plan_match
from kvstate.planner.alloc import plan_decode, plan_extend
from kvstate.planner.requests import RequestCursor, plan_release
from kvstate.state import Geometry

GEOMETRY = Geometry(num_pages=32, page_size=4, num_rows=4, row_width=128)


def _run(engine: Engine) -> None:
    """Two requests sharing a prompt: admit, decode, finish (every batch a planner decision)."""
    prompt = list(range(1, 14))
    for row in (4, 3):
        engine.apply(ev.ReqAlloc((row,)))
        with engine.batch() as b:
            match = plan_match(b, prompt, limit=len(prompt) - 1)
            if match.length:
                b.emit(ev.Lock(match.last_node))
                b.emit(ev.Assign(row, 0, match.slots))
            assert plan_extend(b, [(row, len(prompt))], at_head=True) is not None
        with engine.batch() as b:
            assert plan_decode(b, [row], at_head=True) is not None
        with engine.batch() as b:
            plan_release(b, RequestCursor(row, match.length, match.last_node), prompt + [99],
                         prompt_len=len(prompt), owned=len(prompt) + 1, checkpoint=True,
                         at_head=True)


@pytest.mark.parametrize("verify_every", [0, 1, 5])
def test_live_and_persistent_engines_agree(verify_every):
    live = Engine(GEOMETRY, verify_every=verify_every)
    persistent = Engine(GEOMETRY, backend="persistent")
    _run(live)
    _run(persistent)
    assert live.events == persistent.events
    assert live.state.fingerprint() == persistent.state.fingerprint()
    assert check(live.view) == check(live.state) == []
    assert live.state is live.state  # cached until the next event


def test_state_is_frozen_from_the_journal_or_by_copy():
    engine = Engine(GEOMETRY)
    _run(engine)
    first = engine.state
    engine.apply(ev.ReqAlloc((2,)))
    second = engine.state  # one event since the last freeze: re-applied, not copied
    assert second.seq == first.seq + 1 and second.requests[2].pages == ()
    assert second.fingerprint() == engine.view.fingerprint()


def test_a_refused_event_changes_nothing():
    engine = Engine(GEOMETRY)
    _run(engine)
    before = engine.state.fingerprint()
    count = len(engine.events)
    with pytest.raises(InvalidEvent):
        engine.apply(ev.Free((1,)))
    with pytest.raises(InvalidEvent):
        engine.apply(ev.Allocate((10**20,)))  # out of range: refused by validation
    assert engine.state.fingerprint() == before and len(engine.events) == count


def test_a_failed_batch_rolls_back():
    engine = Engine(GEOMETRY)
    _run(engine)
    before = engine.state.fingerprint()
    with pytest.raises(InvalidEvent), engine.batch() as b:
        b.emit(ev.ReqAlloc((2,)))
        b.emit(ev.Free((1,)))  # refused: the first event of the batch is undone
    assert engine.view.fingerprint() == before and engine.state.fingerprint() == before


@pytest.mark.parametrize("backend", ["live", "persistent"])
def test_a_state_frozen_inside_a_batch_does_not_survive_its_rollback(backend):
    # A reader (a listener's ``before``, a mirror) may freeze the state part way through
    # a batch; the batch's own events must still be undone when a later one is refused.
    engine = Engine(GEOMETRY, backend=backend)
    _run(engine)
    before = engine.state.fingerprint()
    with pytest.raises(InvalidEvent), engine.batch() as b:
        b.emit(ev.ReqAlloc((2,)))
        inside = engine.state
        assert 2 in inside.requests  # the freeze shows the batch so far
        b.emit(ev.Free((1,)))
    assert engine.view.fingerprint() == before and engine.state.fingerprint() == before
    assert 2 not in engine.state.requests
    engine.apply(ev.ReqAlloc((2,)))  # and the engine goes on from the state before the batch
    assert 2 in engine.state.requests and check(engine.state) == []


def test_listeners_hear_of_a_rolled_back_batch():
    engine = Engine(GEOMETRY)
    _run(engine)
    undone: list[list[str]] = []

    class Follower:
        def after(self, events, view):
            raise AssertionError("a rolled-back batch is never committed")

        def rolled_back(self, events):
            undone.append([type(event).__name__ for event in events])

    engine.subscribe(Follower())
    with pytest.raises(InvalidEvent), engine.batch() as b:
        b.emit(ev.ReqAlloc((2,)))
        b.emit(ev.Free((1,)))
    assert undone == [["ReqAlloc"]]  # the refused event is not among them: it never applied


def test_a_batch_that_cannot_roll_back_breaks_the_engine():
    engine = Engine(GEOMETRY)
    engine.state  # noqa: B018 - freeze once so a journal exists
    engine._journal = None  # as after a long run nobody froze: no way back  # noqa: SLF001
    with pytest.raises(EngineBroken), engine.batch() as b:
        b.emit(ev.ReqAlloc((2,)))
        b.emit(ev.Free((1,)))
    with pytest.raises(EngineBroken):
        engine.apply(ev.ReqAlloc((3,)))


def test_commit_events_is_a_batch_without_the_batch_object():
    for backend in ("live", "persistent"):
        engine, batched = Engine(GEOMETRY, backend=backend), Engine(GEOMETRY, backend=backend)
        listener = Listener()
        engine.subscribe(listener)
        engine.commit_events([ev.ReqAlloc((4,))])
        with batched.batch() as b:
            b.emit(ev.ReqAlloc((4,)))
        assert engine.state.fingerprint() == batched.state.fingerprint()
        assert listener.batches == [["ReqAlloc"]] and listener.seen_before == [("ReqAlloc", 0)]
        before = engine.state.fingerprint()
        with pytest.raises(InvalidEvent):
            engine.commit_events([ev.Free((30,))])  # refused: nothing applied, nothing committed
        assert engine.state.fingerprint() == before and len(engine.events) == 1
        assert listener.batches == [["ReqAlloc"]] and listener.discarded == ["Free"]
        with engine.batch() as b, pytest.raises(RuntimeError, match="do not nest"):
            engine.commit_events([ev.ReqAlloc((3,))])
        assert engine.state.fingerprint() == before
        engine.commit_events([ev.ReqAlloc((3,))])  # the refusals left the engine usable
        assert listener.batches[-1] == ["ReqAlloc"]
        before = engine.state.fingerprint()
        with pytest.raises(InvalidEvent):  # the second is refused: the first is rolled back
            engine.commit_events([ev.ReqAlloc((2,)), ev.Free((30,))])
        assert engine.state.fingerprint() == before and listener.batches[-1] == ["ReqAlloc"]


def test_commit_events_refuses_a_broken_engine():
    engine = Engine(GEOMETRY)
    engine.state  # noqa: B018 - freeze once so a journal exists
    engine._journal = None  # noqa: SLF001 - no way back, as in the test above
    with pytest.raises(EngineBroken), engine.batch() as b:
        b.emit(ev.ReqAlloc((2,)))
        b.emit(ev.Free((1,)))
    with pytest.raises(EngineBroken):
        engine.commit_events([ev.ReqAlloc((3,))])


class Listener:
    def __init__(self, fail_on: type | None = None):
        self.seen_before: list[tuple[str, int]] = []
        self.batches: list[list[str]] = []
        self.discarded: list[str] = []
        self.fail_on = fail_on

    def before(self, event, view):
        self.seen_before.append((type(event).__name__, view.seq))

    def discard(self, event):
        self.discarded.append(type(event).__name__)

    def after(self, events, view):
        if self.fail_on is not None and any(isinstance(e, self.fail_on) for e in events):
            raise OSError("disk full")
        self.batches.append([type(e).__name__ for e in events])


def test_listeners_see_each_batch_whole():
    engine = Engine(GEOMETRY)
    listener = Listener()
    engine.subscribe(listener)
    engine.apply(ev.ReqAlloc((4,)))
    with engine.batch() as b:
        plan_extend(b, [(4, 9)], at_head=True)
    assert listener.batches == [["ReqAlloc"], ["Allocate", "Append"]]
    assert listener.seen_before == [("ReqAlloc", 0), ("Allocate", 1), ("Append", 2)]
    with pytest.raises(InvalidEvent):
        engine.apply(ev.Free((30,)))
    assert listener.discarded == ["Free"]


class AllocateOnly(Listener):
    before_events = (ev.Allocate, ev.Free)


def test_a_listener_naming_before_events_is_called_for_those_alone():
    engine = Engine(GEOMETRY)
    typed, every = AllocateOnly(), Listener()
    engine.subscribe(typed)
    engine.subscribe(every)
    engine.apply(ev.ReqAlloc((4,)))
    with engine.batch() as b:
        plan_extend(b, [(4, 9)], at_head=True)
    assert typed.seen_before == [("Allocate", 1)]
    assert every.seen_before == [("ReqAlloc", 0), ("Allocate", 1), ("Append", 2)]
    assert typed.batches == every.batches == [["ReqAlloc"], ["Allocate", "Append"]]
    with pytest.raises(InvalidEvent):
        engine.apply(ev.ReqFree((30,)))  # not one of its types: neither before nor discard
    with pytest.raises(InvalidEvent):
        engine.apply(ev.Free((30,)))
    assert typed.discarded == ["Free"] and every.discarded == ["ReqFree", "Free"]
    assert typed.seen_before == [("Allocate", 1), ("Free", 3)]
    engine.unsubscribe(typed)
    with engine.batch() as b:
        plan_extend(b, [(4, 11)], at_head=True)
    assert every.seen_before[-2][0] == "Allocate"
    assert typed.seen_before == [("Allocate", 1), ("Free", 3)]  # unsubscribed: no more calls


def test_a_failing_listener_is_detached_after_the_batch_is_applied():
    engine = Engine(GEOMETRY)
    bad, good = Listener(fail_on=ev.Append), Listener()
    engine.subscribe(bad)
    engine.subscribe(good)
    engine.apply(ev.ReqAlloc((4,)))
    with pytest.raises(ListenerError), engine.batch() as b:
        plan_extend(b, [(4, 9)], at_head=True)
    assert engine.view.requests[4].committed == 9  # the whole batch was applied
    assert good.batches[-1] == ["Allocate", "Append"]  # the others still saw it
    engine.apply(ev.ReqFree((4,)))
    assert bad.batches == [["ReqAlloc"]]  # detached


def test_verify_every_names_the_first_diverging_event(monkeypatch):
    from kvstate.events import Lock
    from kvstate.rules import RULES

    engine = Engine(GEOMETRY, verify_every=4)
    real = RULES[Lock]

    def drifting(s, event):  # a live-only bug: the lock also bumps the clock
        real(s, event)
        if type(s).__name__ == "LiveState":
            s.clock += 1

    monkeypatch.setitem(RULES, Lock, drifting)
    with pytest.raises(VerificationError) as caught:
        _run(engine)
    assert isinstance(caught.value.event, Lock)


def test_insert_through_a_batch_matches_the_persistent_plan():
    from kvstate.planner import PlanBuilder

    engine = Engine(GEOMETRY)
    engine.apply(ev.Allocate((5, 6)))
    builder = PlanBuilder(engine.state)
    plan_insert(builder, [1, 2, 3, 4, 5, 6, 7, 8], [20, 21, 22, 23, 24, 25, 26, 27], 0)
    plan = builder.done(None)
    engine.commit(plan)
    assert engine.state.fingerprint() == plan.state.fingerprint()
