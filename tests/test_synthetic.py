"""The ``kvstate record`` workload generator (``kvstate.workloads.synthetic``): memory and determinism."""

from __future__ import annotations

import random
import tracemalloc

from kvstate.workloads.synthetic import HISTORY_LENGTH, WorkloadSpec, _Prompts, run_synthetic


def _retained_after(prompts: _Prompts, count: int) -> int:
    """Draw ``count`` prompts and remember each as ``run_synthetic`` does at finish; bytes held."""
    for _ in range(count):
        prompts.history.append(prompts.next_prompt())
    return tracemalloc.get_traced_memory()[0]


def test_the_prompt_generator_runs_in_flat_memory() -> None:
    # Regression: every finished prompt used to be kept, so a long recording grew without bound
    # (about 1 KB per request here, 10 MB over this loop).
    spec = WorkloadSpec(requests=0, seed=7)
    tracemalloc.start()
    try:
        prompts = _Prompts(spec, random.Random(7))
        early = _retained_after(prompts, 1_000)
        late = _retained_after(prompts, 9_000)
    finally:
        tracemalloc.stop()
    assert late - early < 64 * 1024, f"grew by {late - early} bytes over 9,000 more prompts"
    assert len(prompts.history) == HISTORY_LENGTH


def test_bounded_history_records_the_same_runs() -> None:
    # Fingerprints and counts recorded with the unbounded history: continuing requests only
    # ever extend one of the last 16 finished prompts, so bounding it changes no draw.
    pinned = {
        WorkloadSpec(requests=300, seed=3, page_size=4, capacity=512):
            ("8223a8f5e8685d4c035cb85a7dd26542", 300, 7),
        WorkloadSpec(requests=300, seed=5): ("4cd608bf6ac3b765525a98e96ba58ddd", 300, 0),
    }
    for spec, expected in pinned.items():
        run = run_synthetic(spec, keep_events=False)
        assert (run.engine.state.fingerprint().hex(), run.finished, run.retracted) == expected
