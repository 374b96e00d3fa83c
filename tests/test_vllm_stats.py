"""Prefix-cache statistics counted as vLLM 0.33 counts them (``make_prefix_cache_stats``).

The expected numbers of ``test_stats_match_vllm`` were produced by vLLM 0.33.0
itself: ``tools/diff_vllm.vllm_side`` run on ``OPS`` in the peer venv.
``test_stats_match_a_live_vllm`` reruns that comparison when the peer
interpreter is installed (``KVSTATE_VLLM_PEER`` or ``~/kvstate-peers``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvstate.vllm import KVCacheManager, PrefixCacheStats, Request
from tests.vllm_helpers import admit
from tools.diff_vllm import kvstate_side

STEM = list(range(1, 13))
OPS: list[list[Any]] = [["admit", "r0", STEM, None, 0], ["admit", "r1", [*STEM, 7, 8, 9], None, 0], ["stats"],
       ["preempt", "r1"], ["decode", "r0", 5], ["admit", "r2", [9] * 6, "s1", 0], ["stats"],
       ["free", "r0"], ["free", "r1"], ["free", "r2"], ["reset"], ["stats"], ["stats"]]
CONFIG: dict[str, Any] = {"seed": 7, "block_size": 4, "num_blocks": 11, "max_model_len": 4096,
          "enable_caching": True, "sliding_window": 0}
# [reset, requests, queries, hits, preempted_requests, preempted_queries, preempted_hits]
# per "stats" op, as vLLM 0.33 reported them for OPS.
VLLM_STATS = [[False, 2, 27, 12, 0, 0, 0], [False, 1, 6, 0, 1, 16, 12],
              [True, 0, 0, 0, 0, 0, 0], [False, 0, 0, 0, 0, 0, 0]]


def stats_of(trace: list[Any]) -> list[Any]:
    return [step[1] for step in trace if step[0] == ["stats"]]


def test_stats_match_vllm() -> None:
    trace, violations = kvstate_side(CONFIG, OPS)
    assert violations == []
    assert stats_of(trace) == VLLM_STATS


def _peer() -> str | None:
    candidates = [os.environ.get("KVSTATE_VLLM_PEER"),
                  str(Path.home() / "kvstate-peers" / "venv-vllm" / "bin" / "python")]
    return next((path for path in candidates if path and os.path.exists(path)), None)


@pytest.mark.slow
@pytest.mark.skipif(_peer() is None, reason="needs the vLLM 0.33 peer interpreter")
def test_stats_match_a_live_vllm() -> None:
    tool = Path(__file__).resolve().parent.parent / "tools" / "diff_vllm.py"
    env = dict(os.environ, PYTHONWARNINGS="ignore", VLLM_LOGGING_LEVEL="ERROR")
    proc = subprocess.run([str(_peer()), str(tool), "--vllm-side"], capture_output=True,
                          text=True, env=env, timeout=300,
                          input=json.dumps([{"config": CONFIG, "ops": OPS}]))
    assert proc.returncode == 0, proc.stderr[-2000:]
    [theirs] = json.loads(proc.stdout)
    ours = json.loads(json.dumps(kvstate_side(CONFIG, OPS)[0]))
    assert stats_of(ours) == stats_of(theirs) == VLLM_STATS
    assert ours == theirs, "the whole trace (blocks, queue, ref counts, events) differs"


def test_stats_are_off_by_default_and_reset_when_taken() -> None:
    manager = KVCacheManager(8, 4, 64)
    admit(manager, Request("a", list(range(9)), 4))
    assert manager.make_prefix_cache_stats() is None
    manager = KVCacheManager(8, 4, 64, log_stats=True)
    admit(manager, Request("a", list(range(9)), 4))
    admit(manager, Request("b", list(range(9)), 4))
    assert manager.make_prefix_cache_stats() == PrefixCacheStats(requests=2, queries=18, hits=8)
    assert manager.make_prefix_cache_stats() == PrefixCacheStats()


def test_a_failed_reset_does_not_mark_the_stats() -> None:
    manager = KVCacheManager(8, 4, 64, log_stats=True)
    admit(manager, Request("a", list(range(9)), 4))
    assert manager.reset_prefix_cache() is False
    stats = manager.make_prefix_cache_stats()
    assert stats is not None and stats.reset is False


@pytest.mark.parametrize("caching", [True, False])
def test_requests_that_skip_the_lookup_are_not_counted(caching: bool) -> None:
    manager = KVCacheManager(8, 4, 64, enable_caching=caching, log_stats=True)
    admit(manager, Request("a", list(range(9)), 4, skip_reading_prefix_cache=True))
    admit(manager, Request("b", list(range(9)), 4))
    # "a" is not counted, yet it cached its blocks for "b" to hit.
    expected = PrefixCacheStats(requests=1, queries=9, hits=8) if caching else PrefixCacheStats()
    assert manager.make_prefix_cache_stats() == expected


def test_a_miscount_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """``test_stats_match_vllm`` fails when preempted requests are counted as new ones."""
    original = PrefixCacheStats.record

    def miscount(self: PrefixCacheStats, num_tokens: int, num_hits: int, preempted: bool) -> None:
        original(self, num_tokens, num_hits, False)

    monkeypatch.setattr(PrefixCacheStats, "record", miscount)
    trace, _ = kvstate_side(CONFIG, OPS)
    assert stats_of(trace)[1] == [False, 2, 22, 12, 0, 0, 0] != VLLM_STATS[1]
