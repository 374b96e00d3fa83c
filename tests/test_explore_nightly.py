"""Nightly exploration: the larger scopes (minutes each; marked slow, not in CI).

Run the whole nightly set with one command (see docs/checking.md)::

    KVSTATE_HYPOTHESIS_PROFILE=nightly python -m pytest tests/test_explore_nightly.py \
        tests/test_stateful_model.py tests/test_stateful_sglang_model.py tests/test_canaries.py
"""

from __future__ import annotations

import pytest

from kvstate.checking import run_check


@pytest.mark.slow
@pytest.mark.parametrize("name", ["core6", "planner-paged", "planner-deep", "block-deep"])
def test_nightly_scope(name, tmp_path):
    report = run_check(name, log_dir=tmp_path)
    assert report.violation is None, report.as_json()["violations"]
    assert report.sometimes_missed == []


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_nightly_random_walks(seed, tmp_path):
    report = run_check("core6-1m", walks=200, walk_depth=60, seed=seed, log_dir=tmp_path)
    assert report.violation is None, report.as_json()["violations"]
    assert report.sometimes_missed == []
