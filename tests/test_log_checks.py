"""Replay's two ways of checking agree: incremental checks (what changed) and full checks.

A state corrupted after some event (the corruption reported as touched, as a
buggy rule would have reported its own change) must fail both ways at the
same event with the same first check; and every corpus log replays to the
same outcome, summary and fingerprint on the live and the persistent
backend with a check after every event.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from log_helpers import planner_workload

from kvstate.log import write_log
from kvstate.replay import replay_path
from kvstate.state import ROOT

REPO = Path(__file__).resolve().parent.parent
CORPUS = sorted((REPO / "replay").rglob("*.kvlog"))


def _touch(view: Any, *, pages: tuple = (), nodes: tuple = (), request: Any = None) -> None:
    touched = getattr(view, "touched", None)
    if touched is None:  # full checks: nothing to report
        return
    touched.pages.update(pages)
    touched.nodes.update(nodes)
    if request is not None:
        touched.table(request, 0)


def _free_a_held_page(view: Any) -> bool:
    held = next((p for p in view.holders), None)
    if held is None:
        return False
    view.free_pages = view.free_pages.push_tail([held])
    _touch(view, pages=(held,))
    return True


def _drop_a_holder(view: Any) -> bool:
    page = next((p for p, h in view.holders.items() if any(isinstance(r, int) and r for r in h)),
                None)
    if page is None:
        return False
    del view.holders[page]
    _touch(view, pages=(page,))
    return True


def _lock_a_leaf_alone(view: Any) -> bool:
    node_id = next((n for n, node in view.nodes.items()
                    if n != ROOT and node.parent != ROOT and not node.children), None)
    if node_id is None:
        return False
    view.nodes[node_id].lock_ref += 5
    _touch(view, nodes=(node_id,))
    return True


def _stamp_the_future(view: Any) -> bool:
    node_id = next((n for n in view.nodes if n != ROOT), None)
    if node_id is None:
        return False
    view.nodes[node_id].last_access = view.clock + 10
    _touch(view, nodes=(node_id,))
    return True


def _overgrow_a_request(view: Any) -> bool:
    request = next((r for r, rec in view.requests.items() if rec.allocated), None)
    if request is None:
        return False
    view.requests[request].committed = view.requests[request].allocated + 3
    _touch(view, request=request)
    return True


CORRUPTIONS: dict[str, Callable[[Any], bool]] = {
    "free_a_held_page": _free_a_held_page, "drop_a_holder": _drop_a_holder,
    "lock_a_leaf_alone": _lock_a_leaf_alone, "stamp_the_future": _stamp_the_future,
    "overgrow_a_request": _overgrow_a_request,
}


@pytest.fixture(scope="module")
def workload_log(tmp_path_factory) -> str:
    geometry, events = planner_workload(requests=16, seed=5, page_size=2, capacity=256)
    path = tmp_path_factory.mktemp("checks") / "w.kvlog"
    write_log(path, geometry, events, checkpoint_every=0)
    return str(path)


def _corrupting(corrupt: Callable[[Any], bool], after: int) -> Callable[[int, Any, Any], None]:
    done = []

    def hook(index: int, event: Any, view: Any) -> None:
        if index >= after and not done and corrupt(view):
            done.append(index)

    return hook


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
@pytest.mark.parametrize("after", [5, 40, 150])
def test_incremental_and_full_checks_name_the_same_first_violation(workload_log, name, after):
    outcomes = []
    for full in (False, True):
        result = replay_path(workload_log, full_checks=full,
                             on_event=_corrupting(CORRUPTIONS[name], after))
        failure = result.failure
        assert failure is not None and failure.kind == "invariant", (full, failure)
        outcomes.append((failure.event_index, failure.check))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("path", CORPUS, ids=[p.relative_to(REPO / "replay").as_posix()
                                               for p in CORPUS])
def test_every_corpus_log_replays_the_same_on_both_backends(path):
    results = {backend: replay_path(str(path), backend=backend, check_every=1)
               for backend in ("live", "persistent")}
    seen = []
    for result in results.values():
        failure = None if result.failure is None else result.failure.to_json()
        summary = result.summary.to_json()
        for key in ("seconds", "events_per_second"):
            summary.pop(key)
        seen.append(json.dumps([failure, summary], sort_keys=True))
    assert seen[0] == seen[1]
    assert results["live"].state == results["persistent"].state


@pytest.mark.parametrize("path", CORPUS, ids=[p.relative_to(REPO / "replay").as_posix()
                                               for p in CORPUS])
def test_the_peak_pages_used_is_the_peak_after_every_event(path):
    """The summary reads the free list only after events that take pages; a hook that reads
    it after every event must find the same peak."""
    peak = [0]

    def watch(index: int, event: Any, view: Any) -> None:
        peak[0] = max(peak[0], view.geometry.num_pages - len(view.free_pages))

    result = replay_path(str(path), check_every=0, on_event=watch)
    assert result.summary.peak_pages_used == peak[0]


def test_the_peak_of_a_long_workload_is_exact(workload_log):
    peak = [0]

    def watch(index: int, event: Any, view: Any) -> None:
        peak[0] = max(peak[0], view.geometry.num_pages - len(view.free_pages))

    for backend in ("live", "persistent"):
        peak[0] = 0
        result = replay_path(workload_log, check_every=0, on_event=watch, backend=backend)
        assert result.summary.peak_pages_used == peak[0] > 0
