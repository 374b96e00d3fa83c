"""Delta debugging keeps the failure (kind and check), shrinks hard, and writes a valid log."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstate import Geometry, InvalidEvent, Violation, apply_all, initial_state
from kvstate.events import Allocate, Free, Insert, Lock, ReqAlloc, ReqFree, Touch
from kvstate.log import LogReader, read_events, write_log
from kvstate.replay import replay
from kvstate.replay.minimize import (
    NoFailure,
    Signature,
    minimize_events,
    minimize_file,
)
from kvstate.workloads.synthetic import WorkloadSpec, run_synthetic

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def workload():
    spec = WorkloadSpec(requests=40, seed=4, page_size=4, capacity=512, max_running=4)
    return spec.geometry, list(run_synthetic(spec).engine.events)


def locked_twice(state):
    return [Violation("lock_twice", f"node {n} has lock_ref {node.lock_ref}")
            for n, node in state.nodes.items() if n and node.lock_ref >= 2]


def big_tree(state):
    return [Violation("big_tree", "more than 200 tokens cached")] if state.total_size() > 200 else []


def first_failure(geometry, events, checker):
    state = initial_state(geometry)
    for index, evt in enumerate(events):
        state = apply_all(state, [evt])
        found = checker(state)
        if found:
            return index, found[0].check
    return None


@pytest.mark.parametrize("checker, limit", [(locked_twice, 25), (big_tree, 80)])
def test_minimized_events_fail_the_same_way_and_are_much_shorter(workload, checker, limit):
    geometry, events = workload
    assert first_failure(geometry, events, checker) is not None
    result = minimize_events(geometry, events, checker=checker)
    name = checker(apply_all(initial_state(geometry), result.events))[0].check
    assert result.signature == Signature("invariant", name)
    assert len(result.events) <= limit < len(events)
    # The failure is at the last event and nowhere before it.
    assert first_failure(geometry, list(result.events), checker) == (len(result.events) - 1, name)
    assert result.original_events == len(events)


def test_request_lifecycles_are_dropped_whole(workload):
    geometry, events = workload
    result = minimize_events(geometry, events, checker=locked_twice)
    opened = [r for e in result.events if isinstance(e, ReqAlloc) for r in e.requests]
    total = sum(len(e.requests) for e in events if isinstance(e, ReqAlloc))
    assert len(opened) <= 2 < total


def test_refused_event_keeps_its_precondition():
    geometry = Geometry(num_pages=8)
    events = [Allocate((1, 2)), Free((2,)), Allocate((3,)), Free((1,)), Free((1,))]
    result = minimize_events(geometry, events)
    assert result.signature == Signature("invalid_event",
                                         "Free: page # is already free (double free)")
    assert list(result.events) == [Free((1,))]
    with pytest.raises(InvalidEvent, match="already free"):
        apply_all(initial_state(geometry), result.events)


def test_a_different_failure_is_not_accepted():
    geometry = Geometry(num_pages=8)
    # Dropping the Insert makes the Free legal; dropping the Allocate makes the Insert fail
    # instead: neither keeps the failure, so nothing can go.
    events = [Allocate((4,)), Insert(0, (7,), (4,), 1, 1, 0), Free((4,))]
    result = minimize_events(geometry, events)
    assert result.signature == Signature("invalid_event", "Free: page # is held by tree node #")
    assert list(result.events) == events


def test_node_ids_are_renumbered_when_inserts_are_dropped():
    geometry = Geometry(num_pages=16)
    events = [Allocate((1, 2)), Insert(0, (7, 8), (1, 2), 1, 1, 0),
              Allocate((3, 4)), Insert(0, (9, 9), (3, 4), 2, 2, 0),
              Touch((0, 2), 3), Lock(2), Lock(2)]
    result = minimize_events(geometry, events, checker=locked_twice)
    assert Insert(0, (9, 9), (3, 4), 1, 2, 0) in result.events  # node 2 became node 1
    assert result.events[-1] == Lock(1)
    assert len(result.events) == 4


def test_clean_events_cannot_be_minimized():
    with pytest.raises(NoFailure):
        minimize_events(Geometry(num_pages=4), [Allocate((1,)), Free((1,))])


def test_minimize_file_writes_a_valid_log_that_fails_the_same_way(tmp_path, workload):
    geometry, events = workload
    source, target = tmp_path / "big.kvlog", tmp_path / "small.kvlog"
    free_page = next(iter(apply_all(initial_state(geometry), events[:300]).free_pages))
    writer_events = [*events[:300], Free((free_page,))]
    from kvstate.log import LogWriter, make_header

    writer = LogWriter(source, make_header(geometry, checkpoint_every=64), fsync=False)
    writer.write_events(writer_events)
    writer.close(apply_all(initial_state(geometry), writer_events[:-1]).fingerprint())
    before = replay(LogReader(source))
    assert before.failure is not None and before.failure.kind == "invalid_event"
    result = minimize_file(source, target, checkpoint_every=2)
    assert len(result.events) < 10
    after = replay(LogReader(target))
    assert after.failure is not None
    assert after.failure.kind == "invalid_event"
    assert "already free (double free)" in after.failure.message
    assert "already free (double free)" in before.failure.message
    assert after.failure.event_index == len(result.events) - 1
    header, written = read_events(target)
    assert list(written) == list(result.events)
    assert header.meta["failure"]["kind"] == "invalid_event"


def test_minimize_file_keeps_a_fingerprint_mismatch(tmp_path):
    source = REPO / "replay" / "failing" / "bad_checkpoint.kvlog"
    target = tmp_path / "fp.kvlog"
    result = minimize_file(source, target)
    assert result.signature == Signature("fingerprint", "checkpoint")
    after = replay(LogReader(target))
    assert after.failure is not None and after.failure.kind == "fingerprint"
    assert after.failure.check == "checkpoint"


def test_minimize_a_clean_log_file_raises(tmp_path):
    path = tmp_path / "ok.kvlog"
    write_log(path, Geometry(num_pages=4), [Allocate((1,)), Free((1,)), ReqAlloc(("x",)),
                                            ReqFree(("x",))])
    with pytest.raises(NoFailure):
        minimize_file(path, tmp_path / "out.kvlog")


def test_batched_events_are_shrunk_to_the_element_that_fails():
    geometry = Geometry(num_pages=8, page_size=2, num_rows=4, row_width=16)
    events = [Allocate((1, 2, 3, 4, 5)), Free((1,)), ReqAlloc((1, 2, 3)), Free((2, 3, 1, 4))]
    result = minimize_events(geometry, events)
    assert result.signature == Signature("invalid_event", "Free: page # is already free (double free)")
    # one event freeing one page that is free: the three other pages of the batch are gone
    assert len(result.events) == 1
    (only,) = result.events
    assert isinstance(only, Free) and len(only.pages) == 1
    with pytest.raises(InvalidEvent, match="double free"):
        apply_all(initial_state(geometry), result.events)


@pytest.mark.parametrize("checker", [locked_twice, big_tree])
def test_no_single_batch_reduction_of_the_result_still_fails(workload, checker):
    from kvstate.replay.candidates import batch_reductions, log_weight, replay_candidate

    geometry, events = workload
    result = minimize_events(geometry, events, checker=checker)
    target = result.signature
    minimized = list(result.events)
    weight = log_weight(minimized)
    for index, evt in enumerate(minimized):
        for smaller in batch_reductions(evt, geometry.page_size):
            candidate = [*minimized[:index], smaller, *minimized[index + 1:]]
            outcome = replay_candidate(initial_state(geometry), candidate, set(), target, checker)
            assert outcome.signature != target or log_weight(outcome.events) >= weight, (index, smaller)


def test_a_tiered_log_minimizes_with_its_host_tier(tmp_path):
    """The host tier travels: the events are replayed and written with the header's host pool."""
    from kvstate import apply_all, initial_state
    from kvstate.events import Free
    from kvstate.log import LogWriter, make_header, read_header
    from kvstate.workloads.corpus import tiered_offload_and_load

    geometry, host_pages, events = tiered_offload_and_load("write_back")
    state = apply_all(initial_state(geometry, host_pages=host_pages), events)
    page = next(iter(state.free_pages))
    source, target = tmp_path / "tiered.kvlog", tmp_path / "min.kvlog"
    writer = LogWriter(source, make_header(geometry, checkpoint_every=0, host_pages=host_pages),
                       fsync=False)
    writer.write_events([*events, Free((page,))])
    writer.close(state.fingerprint())
    result = minimize_file(source, target)
    assert result.signature.kind == "invalid_event"
    assert len(result.events) < len(events) + 1
    assert read_header(target).host_pages == host_pages
    replayed = replay(LogReader(target))
    assert replayed.failure is not None and replayed.failure.kind == "invalid_event"
    assert replayed.state.host is not None
