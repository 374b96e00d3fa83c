"""The bounded explorer on pinned small scopes.

Each scope must finish with no violation, every SOMETIMES probe hit, and
exactly the pinned number of unique states and edges: a change in the core's
semantics, the candidate events or the symmetry reduction shows up here as a
count change and has to be acknowledged by updating the pin.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from kvstate import apply
from kvstate.checking import SCOPES, run_check
from kvstate.checking.counterexample import read_log
from kvstate.cli import main
from kvstate.planner.policy import LeafPolicy
from kvstate.state import initial_state

PINNED = {  # scope: (unique states, edges)
    "tiny": (764, 3336),
    "paged": (3210, 12287),
    "tree": (1054, 3463),
    "planner": (3334, 9042),
    "vllm-tiny": (4518, 12680),
    # the newer event kinds (each scope runs the spec model on every candidate)
    "rows-sglang": (2323, 8050),  # Scatter, FreeMapped, dangling entries
    "rows-sglang-paged": (4006, 13876),
    "block": (5811, 14795),  # vLLM's block pool
    "block-paged": (3688, 8359),
    "host": (6467, 18278),  # the host tier
    "mamba": (2154, 6656),  # the Mamba pool (spec model_mamba); "swa": tests/test_explore_hybrid.py
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_pinned_scope(name, tmp_path):
    report = run_check(name, log_dir=tmp_path)
    assert report.violation is None, report.as_json()["violations"]
    assert report.sometimes_missed == []
    assert (report.unique_states, report.edges) == PINNED[name]
    assert report.max_depth == SCOPES[name].max_depth


def test_symmetry_merges_states(tmp_path):
    plain = run_check("tiny", symmetry=False, max_depth=4, log_dir=tmp_path)
    reduced = run_check("tiny", max_depth=4, log_dir=tmp_path)
    assert plain.violation is None and reduced.violation is None
    assert (plain.unique_states, reduced.unique_states) == (342, 87)


@pytest.fixture
def share_twice(monkeypatch):
    """The shared rules with Share broken to accept a page the request already maps (F5)."""
    from kvstate.events import Share
    from kvstate.rules import RULES
    from tests.canary_rules import share_allows_mapped_page

    monkeypatch.setitem(RULES, Share, share_allows_mapped_page(RULES[Share]))


def test_counterexample_is_shortest_replayable_and_logged(share_twice, tmp_path):
    """With Share broken as in finding F5 the explorer finds it in three events."""
    report = run_check("tiny", log_dir=tmp_path)
    assert report.violation is not None
    assert report.violation.names[0] == "refines"
    tags = [type(e).__name__ for e in report.violation.events()]
    assert len(tags) == 3 and tags[-1] == "Share"  # BFS: the shortest path
    geometry, events, meta = read_log(report.log_path)
    assert events == report.violation.events()
    assert meta["expect"]["violation"] == report.violation.names
    state = initial_state(geometry)
    for event in events:
        state = apply(state, event)  # the core accepts every event, the last one included
    assert any(len(set(r.pages)) < len(r.pages) for r in state.requests.values())


def test_random_walks_visit_states(tmp_path):
    report = run_check("core6", walks=20, walk_depth=15, seed=3, log_dir=tmp_path)
    assert report.violation is None
    assert report.unique_states > 100
    assert report.complete is False


def test_cli_json_and_exit_codes(capsys, tmp_path):
    assert main(["check", "--scope", "tiny", "--depth", "3", "--json",
                 "--log-dir", str(tmp_path)]) == 1  # depth 3 cannot reach a split
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"scope", "unique_states", "edges", "max_depth", "violations",
                        "sometimes_missed", "seconds"}
    assert out["violations"] == [] and "split" in out["sometimes_missed"]
    assert main(["check", "--list-scopes"]) == 0
    assert "planner" in capsys.readouterr().out
    assert main(["check", "--scope", "nope"]) == 2


def test_cli_exits_1_on_violation(capsys, share_twice, tmp_path):
    assert main(["check", "--scope", "tiny", "--json", "--log-dir", str(tmp_path)]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["violations"][0]["properties"][0] == "refines"
    assert pathlib.Path(out["violations"][0]["log"]).exists()


def test_policy_flag_loads_a_class(capsys, tmp_path):
    code = main(["check", "--scope", "planner", "--depth", "3", "--json",
                 "--policy", "kvstate.planner.policy:LeafLRU", "--log-dir", str(tmp_path)])
    out = json.loads(capsys.readouterr().out)
    assert out["violations"] == []
    assert code in (0, 1)  # depth 3 may miss probes; the policy itself loaded and ran


def test_planner_rejection_is_reported(monkeypatch, tmp_path):
    """A planner that emits an event the reducer rejects fails ``planner_valid``."""
    import kvstate.checking.planner_level as pl
    from kvstate.events import Free

    real = pl.plan_release

    def leaky(b, cursor, *args, **kwargs):
        real(b, cursor, *args, **kwargs)
        pages = sorted(b.state.holders.keys())
        if pages:
            b.emit(Free((pages[0],)))  # raises: the page is held

    monkeypatch.setattr(pl, "plan_release", leaky)
    report = run_check("planner", max_depth=3, log_dir=tmp_path)
    assert report.violation is not None
    assert report.violation.names == ("planner_valid",)
    assert isinstance(report.violation.path[-1].events[-1], Free)


class FifoPolicy(LeafPolicy):
    """Evict the oldest node first, whatever its last access."""

    def priority(self, state, node_id):
        return (node_id, 0)

    def at_head(self, state):
        return False


def test_check_policy_explores_a_user_policy(tmp_path):
    from kvstate.testing import check_policy

    report = check_policy(FifoPolicy(), "planner", max_depth=4, log_dir=str(tmp_path))
    assert report.violation is None and report.sometimes_missed == []
    assert report.unique_states > 100


def test_check_policy_reports_a_violation(monkeypatch, tmp_path):
    import kvstate.planner.alloc as alloc
    from kvstate.testing import PolicyViolation, check_policy

    monkeypatch.setattr(alloc, "_ensure_pages",
                        lambda builder, needed, at_head, select:
                        needed <= len(builder.state.free_pages))
    with pytest.raises(PolicyViolation, match="no_false_oom"):
        check_policy(FifoPolicy(), "planner", log_dir=str(tmp_path))


def test_strategies_bias_lengths_to_page_boundaries():
    from hypothesis import given, settings

    from kvstate.testing import token_sequences, workloads

    seen: set[int] = set()

    @settings(max_examples=200, database=None, derandomize=True)
    @given(token_sequences(vocab=2, page_size=4), workloads(vocab=2, page_size=4))
    def run(tokens, work):
        assert set(tokens) <= {1, 2} and len(tokens) >= 1
        assert all(len(r["prompt"]) >= 1 for r in work)
        seen.add(len(tokens))

    run()
    assert {3, 4, 5} <= seen
