"""The multi-process BFS (``kvstate check --workers N``) finds exactly what the sequential one does."""

from __future__ import annotations

import json

import pytest

from kvstate.checking import SCOPES, run_check
from kvstate.cli import main
from tests.test_explore_small import PINNED


@pytest.mark.parametrize("name", sorted(PINNED))
def test_pinned_counts_hold_on_two_workers(name, tmp_path):
    report = run_check(name, log_dir=tmp_path, workers=2)
    assert report.violation is None, report.as_json()["violations"]
    assert report.sometimes_missed == []
    assert (report.unique_states, report.edges) == PINNED[name]
    assert report.max_depth == SCOPES[name].max_depth
    assert report.complete and report.mode == "bfs(2 workers)"


def test_three_workers_and_no_symmetry_agree_with_one(tmp_path):
    one = run_check("tree", log_dir=tmp_path, symmetry=False, check_model=False)
    three = run_check("tree", log_dir=tmp_path, symmetry=False, check_model=False, workers=3)
    assert (three.unique_states, three.edges, three.max_depth) == \
        (one.unique_states, one.edges, one.max_depth)
    assert one.unique_states > PINNED["tree"][0]  # without symmetry there are more states


def test_a_state_limit_cuts_the_search(tmp_path):
    report = run_check("paged", log_dir=tmp_path, state_limit=1000, workers=2)
    assert report.unique_states == 1000
    assert not report.complete and report.violation is None


def test_cli_workers(capsys, tmp_path):
    assert main(["check", "--scope", "tiny", "--workers", "2", "--json",
                 "--log-dir", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["unique_states"], out["edges"]) == PINNED["tiny"]
    assert main(["check", "--scope", "tiny", "--workers", "0"]) == 2
    assert "--workers must be >= 1" in capsys.readouterr().err


def test_a_crash_in_a_worker_is_raised_in_the_parent(monkeypatch, tmp_path):
    from kvstate.checking import levels

    def explode(state, event):
        raise ZeroDivisionError("reducer bug")

    monkeypatch.setattr(levels, "apply", explode)
    with pytest.raises(RuntimeError, match="ZeroDivisionError: reducer bug"):
        run_check("tiny", log_dir=tmp_path, workers=2)
