"""One policy protocol for ``check`` and ``simulate``, the rules a policy can break, ``--compare``.

The example policies in ``kvstate.testing.example_policies`` each break one
rule; the explorer must name exactly that rule, on a shortest path (no
violation one command shallower).  LRU, FIFO and LFU must pass.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import kvstate.testing.example_policies as examples
from kvstate.checking import run_check
from kvstate.cli import main
from kvstate.planner.policy import EvictionPolicy, LeafPolicy, PolicyError, load_policy
from kvstate.testing import PolicyViolation, check_policy

BROKEN = {  # example policy: (the rule it breaks, the shortest path of commands to it)
    "IgnoresLocks": ("victims_evictable", ["admit[1]", "checkpoint(row=2)", "evict(one page)"]),
    "OldestAnywhere": ("victims_evictable", ["admit[1]", "admit[1, 1]", "finish(row=2)",
                                             "finish(row=1)", "admit[2, 1]"]),
    "StaleMemo": ("victims_evictable", ["admit[1, 1]", "finish(row=2)", "admit[2, 1]",
                                        "admit[1, 1]"]),
    "OneLeaf": ("victims_enough", ["admit[1, 1]", "extend(row=2, token=1)", "finish(row=2)",
                                   "admit[2, 1]"]),
    "FlushAll": ("victims_minimal", ["admit[1]", "extend(row=2, token=1)", "finish(row=2)",
                                     "admit[2, 1]"]),
    "Alternating": ("policy_deterministic", ["admit[1]", "admit[2]", "finish(row=1)",
                                             "finish(row=2)", "evict(one page)"]),
}
WHY = {"IgnoresLocks": "is locked", "OldestAnywhere": "is not a leaf",
       "StaleMemo": "does not exist", "OneLeaf": "were evictable",
       "FlushAll": "already cover", "Alternating": "on the same state"}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_broken_example_fails_its_rule_on_a_shortest_path(name: str, tmp_path: Path) -> None:
    rule, labels = BROKEN[name]
    with pytest.raises(PolicyViolation) as caught:
        check_policy(getattr(examples, name)(), "planner", log_dir=str(tmp_path))
    violation = caught.value.report.violation
    assert violation is not None
    assert violation.names == (rule,)
    assert WHY[name] in violation.messages[0]
    assert [step.label for step in violation.path] == labels
    shallower = run_check("planner", policy=getattr(examples, name)(),
                          max_depth=len(labels) - 1, log_dir=tmp_path)
    assert shallower.violation is None  # nothing shorter exists
    assert (tmp_path / f"explore-{rule}-planner.msgpack").exists()


class FlipsPlacement(LeafPolicy):
    """Frees at the head on every other question: ``at_head`` must be deterministic too."""

    def __init__(self) -> None:
        self.asked = 0

    def at_head(self, state: object) -> bool:
        self.asked += 1
        return self.asked % 2 == 0


def test_placement_must_be_deterministic(tmp_path: Path) -> None:
    report = run_check("planner", policy=FlipsPlacement(), log_dir=tmp_path)
    assert report.violation is not None
    assert report.violation.names == ("policy_deterministic",)
    assert [step.label for step in report.violation.path] == ["admit[1]"]


@pytest.mark.parametrize("name", ["fifo", "lfu"])
def test_builtin_policies_pass(name: str, tmp_path: Path) -> None:
    # lru is the default policy of the pinned "planner" scope (tests/test_explore_small.py)
    report = check_policy(name, "planner", log_dir=str(tmp_path))
    assert report.complete and report.unique_states > 3000


def test_most_recently_used_first_is_safe(tmp_path: Path) -> None:
    report = check_policy(examples.MostRecentFirst(), "planner", log_dir=str(tmp_path))
    assert report.complete and report.unique_states > 3000


def test_each_world_has_its_own_policy_shown_its_own_path() -> None:
    """The checker calls ``observe`` as the simulator does, on a copy per world (LFU counts)."""
    from kvstate.checking import SCOPES, PlannerLevel

    given = load_policy("lfu")
    level = PlannerLevel(SCOPES["planner"], given)
    start = level.initial()
    steps = {step.label: step for step in level.expand(start)}
    first = steps["admit[1, 1]"].world
    again = {step.label: step for step in level.expand(first)}["finish(row=2)"].world
    assert first.policy.counts == {0: 1}  # the admit's match touched the root
    assert again.policy.counts == {0: 3, 1: 1}  # the finish touched the root, then root and node 1
    assert start.policy.counts == {} and given.counts == {}  # siblings and the caller untouched


# --- one loader, one protocol, for both commands ----------------------------------------------

VICTIMS_ONLY = '''
from kvstate.planner.evict import eviction_order


class NewestLeafFirst:
    """Written against the protocol alone: no priority, no base class."""

    def victims(self, state, num_tokens):
        return eviction_order(state, num_tokens, lambda state, node_id: -node_id)

    def at_head(self, state):
        return False

    def observe(self, events):
        return None


class PriorityOnly:
    def priority(self, state, node_id):
        return node_id
'''


@pytest.fixture
def policy_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A policy file in the current directory (not on sys.path), as a user would write it."""
    name = f"my_policies_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(VICTIMS_ONLY), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    yield name
    sys.modules.pop(name, None)


def write_conversations(path: Path) -> Path:
    """A1, B1, C1, then B2 extends B1: 2-block prompts of 512-token blocks, 1 output token."""
    prompts = [[0, 1], [2, 3], [4, 5], [2, 3, 6]]
    path.write_text("".join(json.dumps({"timestamp": i, "input_length": 512 * len(ids),
                                        "output_length": 1, "hash_ids": ids}) + "\n"
                            for i, ids in enumerate(prompts)), encoding="utf-8")
    return path


def test_both_commands_load_a_protocol_policy_from_the_current_directory(
        policy_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = f"{policy_module}:NewestLeafFirst"
    assert isinstance(load_policy(name), EvictionPolicy)
    trace = write_conversations(tmp_path / "t.jsonl")
    assert main(["simulate", str(trace), "--capacity", "6b", "--policy", name, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"] == name
    code = main(["check", "--scope", "planner", "--depth", "3", "--policy", name, "--json",
                 "--log-dir", str(tmp_path)])
    assert code in (0, 1)  # depth 3 may miss SOMETIMES probes; no violation either way
    assert json.loads(capsys.readouterr().out)["violations"] == []


@pytest.mark.parametrize("command", ["check", "simulate"])
def test_a_class_without_the_protocol_is_one_line_and_exit_2(
        command: str, policy_module: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    name = f"{policy_module}:PriorityOnly"
    argv = {"check": ["check", "--scope", "planner", "--policy", name],
            "simulate": ["simulate", str(write_conversations(tmp_path / "t.jsonl")),
                         "--capacity", "6b", "--policy", name]}[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"kvstate {command}: policy '{name}': PriorityOnly lacks "
                          "victims(state, num_tokens), at_head(state), observe(events)")


def test_check_policy_refuses_an_object_without_the_protocol() -> None:
    with pytest.raises(PolicyError, match="lacks victims"):
        check_policy(examples.MostRecentFirst.priority, "planner")  # type: ignore[arg-type]


def test_check_takes_the_builtin_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--scope", "planner", "--policy", "fifo", "--depth", "3", "--json",
                 "--log-dir", str(tmp_path)]) in (0, 1)
    assert json.loads(capsys.readouterr().out)["violations"] == []
    assert main(["check", "--scope", "tiny", "--policy", "fifo"]) == 2  # event level: no policy
    assert "planner-level" in capsys.readouterr().err


# --- --compare ----------------------------------------------------------------------------------

def test_compare_reports_the_hit_rate_against_lru(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # 6 pages: A1, B1 fit (4 cached + 1 output page); C1 needs one page, so one 2-page node
    # goes.  LRU drops A1 and B2 hits B1's 2 blocks; MRU drops B1 and B2 misses.
    trace = write_conversations(tmp_path / "t.jsonl")
    argv = ["check", "--policy", "kvstate.testing.example_policies:MostRecentFirst",
            "--compare", "lru", "--trace", str(trace), "--capacity", "6b"]
    assert main([*argv, "--json"]) == 0
    (point,) = json.loads(capsys.readouterr().out)["compare"]
    assert point["capacity_pages"] == 6
    assert point["policy_hit_rate_tokens"] == 0.0
    assert point["baseline_hit_rate_tokens"] == pytest.approx(1024 / (3 * 1024 + 3 * 512), abs=1e-6)
    assert main(argv) == 0
    assert "MostRecentFirst vs lru at 6 pages" in capsys.readouterr().out
    # vLLM's pool as the baseline: B1's two blocks are still cached (lazily evicted) for B2
    assert main([*argv[:4], "vllm", *argv[5:], "--json"]) == 0
    (point,) = json.loads(capsys.readouterr().out)["compare"]
    assert (point["baseline"], point["baseline_hit_rate_tokens"]) == ("vllm", pytest.approx(1024 / 4608))


def test_compare_needs_a_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--policy", "fifo", "--compare", "lru"]) == 2
    assert "--compare and --trace go together" in capsys.readouterr().err


def test_planner_fifo_is_not_kvcache_simulators_fifo() -> None:
    """The difference docs/results.md states: kvcache-simulator's FIFO evicts interior blocks.

    Three blocks; S+a, S+b, S+c, then S+b again.  At S+c the oldest block is
    the shared S: kvcache-simulator's FIFO (the reference ``fifo``) evicts it
    and the last request misses entirely; the planner's leaf-only ``fifo``
    evicts a, so the last request hits S and b, as LRU does.
    """
    from kvstate.simulate import SimulationSettings, simulate
    from tests.trace_fixtures import BLOCK, chain_requests, reference_trace

    requests = chain_requests([([0, 0], BLOCK), ([0, 1], BLOCK), ([0, 2], BLOCK), ([0, 1], BLOCK)])
    sim, trace = reference_trace(requests)
    settings = SimulationSettings(capacity_tokens=3 * BLOCK, policy="fifo", eviction_unit="page",
                                  decode=False)
    planner = simulate(requests, settings, len(requests))
    assert (planner.hit_tokens, planner.total_tokens) == (4 * BLOCK, 8 * BLOCK)
    assert planner.hit_tokens == sim.leaf_lru(trace, 3).hit_tokens
    assert sim.fifo(trace, 3).hit_tokens == 2 * BLOCK  # only the S hits of requests 2 and 3


def test_builtin_priorities_and_the_loader_in_one_fast_pass() -> None:
    """The built-in orders on one small tree, LFU's history, and every loader error (no search:
    this is the policy test the mutation run (tools/mutation.py) uses)."""
    from kvstate import apply_all, initial_state
    from kvstate.events import Allocate, Evict, Insert, Split, Touch
    from kvstate.planner.policy import BUILTIN_POLICIES, LeafFIFO, LeafLFU, LeafLRU, require_policy
    from kvstate.state import Geometry

    state = apply_all(initial_state(Geometry(num_pages=4, num_rows=1)), [
        Allocate((1, 2, 3)), Insert(0, (1,), (1,), 1, 1, 0), Insert(0, (2, 3), (2, 3), 2, 2, 0),
        Touch((1,), 3)])  # node 1 is newer by access, older by creation
    assert LeafLRU().victims(state, 1) == [2] and LeafFIFO().victims(state, 1) == [1]
    assert LeafLRU().victims(state, 3) == [2, 1]
    lfu = LeafLFU()
    lfu.observe([Touch((2,), 4), Touch((2,), 5), Split(2, 1, 3, 6), Touch((1,), 7)])
    assert lfu.counts == {2: 2, 3: 2, 1: 1}
    assert lfu.victims(state, 1) == [1]  # fewest accesses first, whatever the recency
    lfu.observe([Evict((1,))])
    assert 1 not in lfu.counts
    assert LeafLRU().at_head(state) is False
    assert LeafLRU().at_head(initial_state(Geometry(num_pages=2, page_size=2))) is True
    assert {name: type(load_policy(name)) for name in BUILTIN_POLICIES} == BUILTIN_POLICIES
    assert load_policy("lfu") is not load_policy("lfu")
    for name, message in [("nope", "use one of fifo, lfu, lru or module:Class"),
                          ("no_such_module_here:X", "cannot import"),
                          ("kvstate.planner.policy:Nothing", "has no 'Nothing'"),
                          ("kvstate.planner.policy:PolicyError", "lacks victims"),
                          ("kvstate.planner.policy:EvictionPolicy", r"EvictionPolicy\(\) failed")]:
        with pytest.raises(PolicyError, match=message):
            load_policy(name)
    with pytest.raises(PolicyError, match=r"^mine: object lacks victims\(state, num_tokens\), "
                                          r"at_head\(state\), observe\(events\);"):
        require_policy(object(), "mine")
