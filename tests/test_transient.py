"""The transient fast path computes exactly what the pure reducer computes.

Three sources of events, each compared event by event against
``kvstate.reducer.apply``:

* every candidate event (legal and illegal) in every state of small
  event-level scopes, explored breadth first;
* whole synthetic SGLang workloads (large states: hundreds of pages and
  nodes), plus a mutated copy of each event, which is usually illegal;
* every radix log in ``replay/``, replayed through both loops, which must
  report the same summary, failure and final fingerprint.

"Same" means: the same acceptance, and on acceptance a frozen state with the
same fingerprint and the same derived ``leaves`` and ``tree_refs`` indices;
on rejection the transient state is left exactly as it was.
"""

from __future__ import annotations

import random
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstate import events as ev
from kvstate.checking.enabled import candidate_events
from kvstate.checking.levels import geometry_of
from kvstate.checking.scopes import SCOPES
from kvstate.errors import InvalidEvent
from kvstate.log import LogReader, read_header, replay
from kvstate.log.synthetic import WorkloadSpec, run_synthetic
from kvstate.reducer import apply
from kvstate.state import State, initial_state
from kvstate.transient import BLOCK_RULES, RULES, TransientApplier, freeze, rules_for, thaw
from tests.test_replay_corpus import CORPUS as REPLAY
from tests.test_replay_corpus import LOGS
from tests.vllm_helpers import admit


def same_state(got: State, want: State) -> None:
    assert got.fingerprint() == want.fingerprint(), "transient state differs: fingerprint"
    assert dict(got.leaves.items()) == dict(want.leaves.items()), "transient state differs: leaves"
    assert dict(got.tree_refs.items()) == dict(want.tree_refs.items()), \
        "transient state differs: tree_refs"


def declined_on_purpose(event: ev.Event) -> bool:
    """Valid events the transient rules leave to the reducer (documented in the applier)."""
    if type(event) not in RULES and type(event) not in BLOCK_RULES:
        return True
    if isinstance(event, ev.Allocate):
        request_ids = [request_id for request_id, _ in event.items]
        return len(set(request_ids)) != len(request_ids)
    return False


def compare(state: State, event: ev.Event) -> State | None:
    """Apply ``event`` both ways; return the pure result (None when it is rejected)."""
    try:
        want: State | None = apply(state, event)
    except InvalidEvent:
        want = None
    rule = rules_for(state.geometry.mode).get(type(event))
    if rule is None:
        return want
    ts = thaw(state)
    taken = rule(ts, event)
    if want is None:
        assert not taken, f"transient accepted an event the reducer rejects: {event!r}"
        same_state(freeze(ts), state)  # and it left the state as it was
    elif taken:
        same_state(freeze(ts), want)
        for node in ts.nodes.values():  # the transient-only index stayed exact
            assert node.below == sum(ts.nodes[c].lock_ref for c in node.children.values()), \
                "transient state differs: below"
    else:
        assert declined_on_purpose(event), f"transient declined a valid event: {event!r}"
        same_state(freeze(ts), state)
    return want


@pytest.mark.parametrize("scope_name,limit", [("tiny", 400), ("paged", 400), ("tree", 300),
                                              ("core6", 300)])
def test_every_candidate_event_in_small_scopes(scope_name: str, limit: int) -> None:
    scope = SCOPES[scope_name]
    start = initial_state(geometry_of(scope))
    seen = {start.fingerprint()}
    frontier = [start]
    compared = accepted = 0
    while frontier and len(seen) < limit:
        next_frontier = []
        for state in frontier:
            for event in candidate_events(state, scope):
                after = compare(state, event)
                compared += 1
                if after is None:
                    continue
                accepted += 1
                if after.fingerprint() not in seen and len(seen) < limit:
                    seen.add(after.fingerprint())
                    next_frontier.append(after)
        frontier = next_frontier
    assert len(seen) == limit  # the bound was reached, so the states are not trivial
    assert accepted > 0 and compared > accepted  # both legal and illegal events were compared


def mutate(event: ev.Event, rng: random.Random) -> ev.Event:
    """The same event with one integer field nudged (usually making it illegal)."""
    fields = attrs.fields(type(event))  # type: ignore[arg-type]
    candidates = []
    for field in fields:
        value = getattr(event, field.name)
        if type(value) is int:
            candidates.append((field.name, value + rng.choice((-1, 1, 2))))
        elif type(value) is tuple and value and all(type(v) is int for v in value):
            changed = list(value)
            changed[rng.randrange(len(changed))] += rng.choice((-1, 1))
            candidates.append((field.name, tuple(changed)))
            candidates.append((field.name, value[:-1]))
            candidates.append((field.name, (*value, value[-1])))
    if not candidates:
        return event
    name, value = rng.choice(candidates)
    return attrs.evolve(event, **{name: value})  # type: ignore[misc]


@pytest.mark.parametrize("page_size,seed", [(1, 3), (4, 5), (16, 8)])
def test_synthetic_workloads_event_by_event(page_size: int, seed: int) -> None:
    # 400 tokens hold about two long requests: evictions, splits and hits all happen
    spec = WorkloadSpec(requests=60, seed=seed, page_size=page_size, capacity=400, max_running=6)
    run = run_synthetic(spec)
    events = run.engine.events
    rng = random.Random(seed)
    state = initial_state(run.engine.state.geometry)
    applier = TransientApplier(state)
    rejected = 0
    for event in events:
        if compare(state, mutate(event, rng)) is None:
            rejected += 1
        state = apply(state, event)
        applier.apply(event)
        if len(state.nodes) > 1:  # freezing every event keeps the cached frozen nodes honest
            same_state(applier.state(), state)
    same_state(applier.state(), state)
    same_state(state, run.engine.state)
    assert applier.fallbacks == 0
    assert {"ev", "sp", "in", "as", "al"} <= {event.TAG for event in events}
    assert rejected > len(events) // 4  # the mutations exercised the rejection paths


def test_applier_raises_the_reducers_error_and_keeps_the_state() -> None:
    state = initial_state(geometry_of(SCOPES["tiny"]))
    applier = TransientApplier(state)
    applier.apply(ev.Allocate((1,)))
    applier.apply(ev.Free((1,)))
    before = applier.state()
    with pytest.raises(InvalidEvent) as caught:
        applier.apply(ev.Free((1,)))
    with pytest.raises(InvalidEvent) as pure:
        apply(before, ev.Free((1,)))
    assert str(caught.value) == str(pure.value)
    assert "double free" in str(caught.value)
    same_state(applier.state(), before)
    assert applier.fallbacks == 1


def test_reset_goes_through_the_reducer() -> None:
    state = initial_state(geometry_of(SCOPES["tiny"]))
    applier = TransientApplier(state)
    events = [ev.ReqAlloc((1,)), ev.Allocate((2,), ((1, (2,)),)), ev.Reset("rows"),
              ev.Free((2,)), ev.Reset("all")]
    for event in events:
        applier.apply(event)
        state = apply(state, event)
    same_state(applier.state(), state)
    assert applier.fallbacks == 2 and applier.seq == len(events)


def vllm_run_events(seed: int, window: int | None, caching: bool) -> tuple[State, list[ev.Event]]:
    """A seeded vLLM front-end run: admissions with prefix hits, decodes, frees,
    evictions, prefix-cache resets and pool-level get/touch/free."""
    from kvstate.vllm.manager import KVCacheManager
    from kvstate.vllm.request import Request

    rng = random.Random(seed)
    manager = KVCacheManager(12, 2, 64, enable_caching=caching, sliding_window=window)
    start = manager.engine.state
    running: dict[str, Request] = {}
    pool_refs: list = []
    for step in range(160):
        action = rng.random()
        if action < 0.35:
            request = Request(f"r{step}", [rng.randrange(3) for _ in range(rng.randint(1, 9))], 2)
            if admit(manager, request)[2] is not None:
                running[request.request_id] = request
        elif action < 0.65 and running:
            request = running[rng.choice(sorted(running))]
            request.append_output_token_ids(rng.randrange(3))
            if manager.allocate_slots(request, 1) is None:
                manager.free(running.pop(request.request_id))
            else:
                request.num_computed_tokens += 1
        elif action < 0.8 and running:
            manager.free(running.pop(rng.choice(sorted(running))))
        elif action < 0.87:
            manager.evict_blocks({rng.randrange(12) for _ in range(2)})
        elif action < 0.9:
            manager.reset_prefix_cache()
        elif action < 0.95:
            pool = manager.block_pool
            pool_refs.extend(pool.get_new_blocks(min(2, pool.get_num_free_blocks())))
        elif pool_refs:
            manager.block_pool.touch(pool_refs[:1])
            manager.block_pool.free_blocks(pool_refs)
            manager.block_pool.free_blocks(pool_refs[:1])
            pool_refs.clear()
    return start, list(manager.engine.events)


@pytest.mark.parametrize("seed,window,caching", [(1, None, True), (2, 3, True), (3, None, False),
                                                 (4, 5, True)])
def test_block_mode_vllm_runs_event_by_event(seed: int, window: int | None, caching: bool) -> None:
    state, events = vllm_run_events(seed, window, caching)
    assert state.geometry.mode == "block"
    rng = random.Random(seed)
    applier = TransientApplier(state)
    rejected = 0
    for event in events:
        if compare(state, mutate(event, rng)) is None:
            rejected += 1
        assert compare(state, event) is not None
        state = apply(state, event)
        applier.apply(event)
        same_state(applier.state(), state)
    assert applier.fallbacks == 0
    tags = {event.TAG for event in events}
    assert {"ba", "bh", "br"} <= tags and (not caching or {"bc", "bu"} <= tags)
    assert rejected > len(events) // 5


def untiered_logs() -> list[Path]:
    """Corpus logs without a host tier (a log whose header does not parse counts too)."""
    logs = []
    for path in LOGS:
        try:
            host_pages = read_header(path).host_pages
        except Exception:  # noqa: BLE001 - a malformed header replays the same either way
            host_pages = 0
        if not host_pages:
            logs.append(path)
    return logs


def summary_without_timing(result: object) -> dict[str, object]:
    out = result.summary.to_json()  # type: ignore[attr-defined]
    out.pop("seconds")
    out.pop("events_per_second")
    return out


@pytest.mark.parametrize("path", untiered_logs(), ids=lambda p: str(p.relative_to(REPLAY)))
@pytest.mark.parametrize("check_every", [0, 64])
def test_corpus_replays_the_same_on_both_paths(path: Path, check_every: int) -> None:
    results = []
    for fast in (False, True):
        with LogReader(str(path), salvage=True) as reader:
            results.append(replay(reader, check_every=check_every, fast=fast))
    pure, fast_result = results
    assert summary_without_timing(fast_result) == summary_without_timing(pure)
    assert fast_result.failure == pure.failure
    assert fast_result.stopped_early == pure.stopped_early


def test_until_stops_at_the_same_event_and_checks_the_state() -> None:
    path = REPLAY / "synthetic" / "sglang_p4_s11_tight.kvlog"
    results = []
    for fast in (False, True):
        with LogReader(str(path)) as reader:
            results.append(replay(reader, check_every=64, until=100, fast=fast))
    assert results[1].stopped_early and results[1].summary.events == 100
    assert summary_without_timing(results[1]) == summary_without_timing(results[0])
    same_state(results[1].state, results[0].state)  # type: ignore[arg-type]


def _free_always_at_tail(ts, event):  # type: ignore[no-untyped-def]
    from kvstate.transient import pages
    return pages.free(ts, attrs.evolve(event, at_head=False))


def _unlock_without_own_lock_check(ts, event):  # type: ignore[no-untyped-def]
    node = ts.nodes.get(event.node)
    if node is None or event.node == 0 or node.lock_ref == 0:
        return False
    node.lock_ref -= 1  # forgets the ancestors and the "own lock" rule
    return True


@pytest.mark.parametrize("kind,broken", [(ev.Free, _free_always_at_tail),
                                         (ev.Unlock, _unlock_without_own_lock_check)])
def test_canary_a_broken_transient_rule_is_caught(monkeypatch: pytest.MonkeyPatch,
                                                  kind: type[ev.Event], broken: object) -> None:
    monkeypatch.setitem(RULES, kind, broken)
    scope, limit = ("tree", 300) if kind is ev.Unlock else ("paged", 400)
    with pytest.raises(AssertionError, match="transient (state differs|accepted an event)"):
        test_every_candidate_event_in_small_scopes(scope, limit)


def brute_force_diff(path_a: Path, path_b: Path) -> tuple[int | None, int | None, str | None]:
    """Step both logs with the pure reducer and compare fingerprints after every event."""
    from itertools import zip_longest

    from kvstate.log.diff import describe_state_difference
    from kvstate.log.reader import read_events

    header_a, events_a = read_events(path_a)
    header_b, events_b = read_events(path_b)
    state_a: State | None = initial_state(header_a.geometry)
    state_b: State | None = initial_state(header_b.geometry)
    if state_a != state_b:
        assert state_a is not None and state_b is not None
        firsts = [i for i, (x, y) in enumerate(zip_longest(events_a, events_b)) if x != y]
        return (firsts[0] if firsts else None), -1, describe_state_difference(state_a, state_b)
    event_index = None
    for index, (evt_a, evt_b) in enumerate(zip_longest(events_a, events_b)):
        if event_index is None and evt_a != evt_b:
            event_index = index
        refused = []
        for which, (state, evt) in enumerate(((state_a, evt_a), (state_b, evt_b))):
            if state is not None and evt is not None:
                try:
                    state = apply(state, evt)
                except InvalidEvent as exc:
                    refused.append(f"{'AB'[which]}'s event refused: {exc.precondition}")
            if which == 0:
                state_a = state
            else:
                state_b = state
        if refused:
            return event_index, index, refused[0]
        assert state_a is not None and state_b is not None
        if state_a != state_b:
            return event_index, index, describe_state_difference(state_a, state_b)
    return event_index, None, None


def test_diff_matches_stepping_both_logs_and_comparing_every_state(tmp_path: Path) -> None:
    from kvstate.log import write_log
    from kvstate.log.diff import diff_logs
    from kvstate.log.reader import read_events

    synthetic = REPLAY / "synthetic" / "sglang_p4_s11_tight.kvlog"
    header, events = read_events(synthetic)
    prefix = tmp_path / "prefix.kvlog"
    write_log(prefix, header.geometry, events[: len(events) // 2])
    vllm = REPLAY / "vllm" / "prefix_caching_b4.kvlog"
    vllm_header, vllm_events = read_events(vllm)
    vllm_prefix = tmp_path / "vllm_prefix.kvlog"
    write_log(vllm_prefix, vllm_header.geometry, vllm_events[:-3])
    double_free = REPLAY / "failing" / "double_free.kvlog"
    pairs = [(synthetic, synthetic), (synthetic, prefix), (prefix, synthetic),
             (synthetic, REPLAY / "synthetic" / "sglang_p16_s5.kvlog"),
             (vllm, vllm), (vllm, vllm_prefix), (double_free, double_free),
             (REPLAY / "seed" / "001_prefix_hit_walkthrough.kvlog", double_free)]
    for path_a, path_b in pairs:
        with LogReader(str(path_a)) as reader_a, LogReader(str(path_b)) as reader_b:
            found = diff_logs(reader_a, reader_b)
        assert (found.event_index, found.state_index, found.state_difference) == \
            brute_force_diff(path_a, path_b), (path_a.name, path_b.name)
    with LogReader(str(double_free)) as reader_a, LogReader(str(double_free)) as reader_b:
        refused = diff_logs(reader_a, reader_b)
    assert refused.event_index is None and refused.state_index == 17
    assert "already free" in (refused.note or "")


def _release_all_to_head(ts, event):  # type: ignore[no-untyped-def]
    from kvstate.transient import block
    return block.block_release(ts, attrs.evolve(event, cached_to_tail=False))


def test_canary_a_broken_block_rule_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvstate.events_block import BlockRelease

    monkeypatch.setitem(BLOCK_RULES, BlockRelease, _release_all_to_head)
    with pytest.raises(AssertionError, match="transient (state differs|accepted an event)"):
        test_block_mode_vllm_runs_event_by_event(1, None, True)


@pytest.mark.parametrize("scope_name,window", [("vllm-tiny", None), ("vllm-paged", None),
                                               ("vllm-tiny", 2)])
def test_every_vllm_explorer_edge(scope_name: str, window: int | None) -> None:
    """Every event of every front-end call the vLLM explorer scope makes, state by state."""
    from kvstate.vllm.explore import VllmLevel

    level = VllmLevel(SCOPES[scope_name], sliding_window=window)
    start = level.initial()
    seen = {level.view(start)}
    frontier = [start]
    compared = 0
    while frontier and len(seen) < 300:
        next_frontier = []
        for world in frontier:
            for step in level.expand(world):
                if step.world is None:
                    continue
                state = level.state(world)
                for event in step.events:
                    state = compare(state, event)  # type: ignore[assignment]
                    assert state is not None
                    compared += 1
                assert state.fingerprint() == level.state(step.world).fingerprint()
                view = level.view(step.world)
                if view not in seen:
                    seen.add(view)
                    next_frontier.append(step.world)
        frontier = next_frontier
    assert compared > 200


_BROKEN_SOURCE = REPLAY / "synthetic" / "sglang_p4_s11_tight.kvlog"


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_log_broken_anywhere_fails_the_same_way_on_both_paths(data: st.DataObject) -> None:
    """A well-framed log whose events go wrong at a random point (an event mutated,
    dropped or repeated): both replay loops stop at the same event with the same error."""
    import tempfile

    from kvstate.log import LogWriter, make_header
    from kvstate.log.reader import read_events

    header, events = read_events(_BROKEN_SOURCE)
    index = data.draw(st.integers(0, len(events) - 1), label="index")
    how = data.draw(st.sampled_from(["mutate", "drop", "repeat"]), label="how")
    if how == "mutate":
        events[index] = mutate(events[index], random.Random(data.draw(st.integers(0, 99))))
    elif how == "drop":
        del events[index]
    else:
        events.insert(index, events[index])
    check_every = data.draw(st.sampled_from([0, 64]), label="check_every")
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "broken.kvlog"
        writer = LogWriter(path, make_header(header.geometry, checkpoint_every=0), fsync=False)
        writer.write_events(events)
        writer.close(bytes(16))  # a wrong end fingerprint: a log that got this far still fails
        results = []
        for fast in (False, True):
            with LogReader(str(path)) as reader:
                results.append(replay(reader, check_every=check_every, fast=fast))
    assert results[0].failure is not None
    assert results[1].failure == results[0].failure
    assert summary_without_timing(results[1]) == summary_without_timing(results[0])
