"""Exhaustive exploration of the vLLM front end in tiny scopes (kvstate.vllm.explore)."""

from __future__ import annotations

from collections import deque

import pytest

from kvstate.checking.explorer import explore
from kvstate.invariants import check
from kvstate.vllm.explore import VllmLevel, World, vllm_scope


@pytest.mark.parametrize("block_size", [1, 2])
def test_explorer_finds_no_violation_in_full_attention(block_size: int) -> None:
    level = VllmLevel(vllm_scope(block_size=block_size, max_depth=4))
    report = explore(level, probes=())
    assert report.violation is None, report.violation
    assert report.complete and report.unique_states > 500


def test_sliding_window_breadth_first() -> None:
    """BFS with kvstate's invariants and the vLLM edge checks (null-padded tables)."""
    level = VllmLevel(vllm_scope(block_size=1, max_depth=4), sliding_window=2)
    seen = {level.view(level.initial())}
    frontier: deque[tuple[World, int]] = deque([(level.initial(), 0)])
    nulls = 0
    while frontier:
        world, depth = frontier.popleft()
        if depth == 4:
            continue
        for step in level.expand(world):
            assert step.violations == (), (step.label, step.violations)
            assert check(step.world.state) == [], step.label
            assert level.world_checks(step.world) == []
            nulls += any(0 in record.pages for record in step.world.state.requests.values())
            key = level.view(step.world)
            if key not in seen:
                seen.add(key)
                frontier.append((step.world, depth + 1))
    assert len(seen) > 100 and nulls > 0  # the window really replaced blocks with null
