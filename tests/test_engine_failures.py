"""The engine when something goes wrong inside a batch: a listener failing in ``before``,
``discard`` or ``rolled_back``, a rule failing with something other than a refusal, a batch
object entered inside another, a listener changing the engine from ``after``.  In every case
the state is what it was before the batch, the events the engine reports replay to it, and
the listeners still attached agree with it."""

from __future__ import annotations

import pytest

from kvstate import Engine, InvalidEvent, check
from kvstate import events as ev
from kvstate.backends.persistent import apply_all
from kvstate.errors import ListenerError
from kvstate.rules.registry import RULES
from kvstate.state import Geometry

GEOMETRY = Geometry(num_pages=32, page_size=4, num_rows=4, row_width=128)
BLOCKS = Geometry(num_pages=8, page_size=4, mode="block")


class Preparing:
    """A listener that prepares in ``before`` and must hear ``discard`` for what did not
    happen: ``pending`` is what it prepared and was neither committed nor discarded."""

    def __init__(self, fail_in: str | None = None) -> None:
        self.pending: list[ev.Event] = []
        self.committed: list[ev.Event] = []
        self.fail_in = fail_in

    def before(self, event, view):
        if self.fail_in == "before":
            self.fail_in = None
            raise RuntimeError("before failed")
        self.pending.append(event)

    def discard(self, event):
        if self.fail_in == "discard":
            raise RuntimeError("discard failed")
        self.pending.remove(event)

    def rolled_back(self, events):
        if self.fail_in == "rolled_back":
            raise RuntimeError("rolled_back failed")
        for event in events:
            self.pending.remove(event)

    def after(self, events, view):
        for event in events:
            self.pending.remove(event)
        self.committed.extend(events)


def replays(engine: Engine) -> bool:
    return apply_all(engine.initial_state, list(engine.events)).fingerprint() == \
        engine.state.fingerprint()


@pytest.mark.parametrize("backend", ["live", "persistent"])
def test_a_listener_failing_in_before_leaves_the_others_clean(backend):
    engine = Engine(GEOMETRY, backend=backend)
    clean, flaky = Preparing(), Preparing(fail_in="before")
    engine.subscribe(clean)
    engine.subscribe(flaky)
    before = engine.state.fingerprint()
    with pytest.raises(RuntimeError, match="before failed"):
        engine.apply(ev.ReqAlloc((1,)))
    assert engine.state.fingerprint() == before
    assert clean.pending == [] and flaky.pending == []  # the first listener was told
    engine.apply(ev.ReqAlloc((1,)))
    assert clean.committed == flaky.committed == [ev.ReqAlloc((1,))]
    assert replays(engine)


def test_a_listener_failing_in_discard_or_rolled_back_is_detached():
    engine = Engine(GEOMETRY)
    for hook in ("discard", "rolled_back"):
        listener, other = Preparing(fail_in=hook), Preparing()
        engine.subscribe(listener)
        engine.subscribe(other)
        before = engine.state.fingerprint()
        with pytest.raises(InvalidEvent) as refused, engine.batch() as b:
            b.emit(ev.ReqAlloc((2,)))
            b.emit(ev.Free((1,)))  # refused
        assert any(hook in note for note in refused.value.__notes__)
        assert engine.state.fingerprint() == before and other.pending == []
        assert listener not in engine._listeners  # noqa: SLF001
        engine.unsubscribe(other)
    engine.apply(ev.ReqAlloc((2,)))
    assert replays(engine) and check(engine.state) == []


@pytest.mark.parametrize("backend", ["live", "persistent"])
@pytest.mark.parametrize("catch", [False, True])
def test_a_rule_failing_part_way_is_rolled_back(monkeypatch, backend, catch):
    real = RULES[ev.ReqAlloc]

    def half_done(s, event):  # writes the event, then fails as a buggy rule would
        real(s, event)
        raise TypeError("a bug in the rule")

    engine = Engine(GEOMETRY, backend=backend)
    engine.apply(ev.ReqAlloc((1,)))
    listener = Preparing()
    engine.subscribe(listener)
    before = engine.state.fingerprint()
    monkeypatch.setitem(RULES, ev.ReqAlloc, half_done)
    if catch:  # a block that swallows the failure still cannot commit what the rule did
        with pytest.raises(RuntimeError, match="rule failed"), engine.batch() as b:
            try:
                b.emit(ev.ReqAlloc((2,)))
            except TypeError:
                pass
    else:
        with pytest.raises(TypeError), engine.batch() as b:
            b.emit(ev.ReqAlloc((2,)))  # the batch's first event: nothing to roll back but it
    monkeypatch.undo()
    assert engine.view.fingerprint() == before and engine.state.fingerprint() == before
    assert listener.pending == [] and listener.committed == []
    engine.apply(ev.ReqAlloc((2,)))
    assert replays(engine) and check(engine.state) == []


def test_a_batch_made_earlier_does_not_open_inside_another():
    engine = Engine(BLOCKS)
    heard: list[ev.Event] = []
    engine.subscribe(lambda event, view: heard.append(event))
    outer, inner = engine.batch(), engine.batch()
    with outer:
        outer.emit(ev.BlockAlloc(0, (1,)))
        with pytest.raises(RuntimeError, match="do not nest"), inner:
            inner.emit(ev.BlockAlloc(0, (2,)))
    assert list(engine.events) == heard == [ev.BlockAlloc(0, (1,))]
    assert sorted(engine.state.holders) == [1] and replays(engine)
    with inner:  # once the other is closed it opens as usual
        inner.emit(ev.BlockAlloc(0, (2,)))
    assert sorted(engine.state.holders) == [1, 2] and replays(engine)


def test_a_listener_cannot_change_the_engine_from_after():
    engine = Engine(GEOMETRY)
    order: list[list[ev.Event]] = []

    class Meddler:
        def after(self, events, view):
            engine.apply(ev.ReqAlloc((3,)))

    class Follower:
        def after(self, events, view):
            order.append(list(events))

    engine.subscribe(Meddler())
    engine.subscribe(Follower())
    with pytest.raises(ListenerError) as failed:
        engine.apply(ev.ReqAlloc((1,)))
    assert isinstance(failed.value.__cause__ or failed.value.error, RuntimeError)
    assert order == [[ev.ReqAlloc((1,))]] and list(engine.events) == [ev.ReqAlloc((1,))]
    engine.apply(ev.ReqAlloc((3,)))  # the meddler is detached; the engine goes on
    assert order[-1] == [ev.ReqAlloc((3,))] and replays(engine)


def test_the_executor_keeps_following_after_another_listener_fails_in_before():
    from kvstate.executor import REPLAY_MODEL, TorchExecutor
    from kvstate.vllm import KVCacheManager, Request

    manager = KVCacheManager(12, 4, 64)
    geometry = manager.engine.geometry
    executor = TorchExecutor(REPLAY_MODEL, geometry.num_pages, geometry.page_size, device="cpu")
    executor.attach(manager.engine)
    manager.engine.subscribe(Preparing(fail_in="before"))
    request = Request("a", list(range(10)), 4)
    with pytest.raises(RuntimeError, match="before failed"):
        manager.allocate_slots(request, 10)
    assert manager.allocate_slots(request, 10) is not None  # no ListenerError: in step
    assert executor in manager.engine._listeners  # noqa: SLF001
