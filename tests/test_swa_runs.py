"""Seeded FULL + SWA runs through the front end: both backends, the spec model, the checks, logs.

Each run is the kvstate side of ``tools/diff_sglang_hybrid.py`` (bare tree
calls and 0.5.23's request flows on small pools, so every kind of eviction,
recovery and window slide happens).  Its events are then re-applied one by
one on the persistent and the live backend (same fingerprint after each),
stepped through the independent model (``specs.model_swa``: the same state
after each, the same refusals for corrupted events), checked by every named
invariant from scratch and incrementally (both silent), recorded by the
``Recorder`` and replayed with a check after every event.
"""

from __future__ import annotations

import random

import msgspec
import pytest

from kvstate.backends.live import LiveState
from kvstate.backends.persistent import apply_valid
from kvstate.errors import InvalidEvent
from kvstate.invariants import check
from kvstate.invariants.incremental import IncrementalChecker
from kvstate.log import Recorder
from kvstate.replay import replay_path
from kvstate.state import initial_state
from specs.model_swa import ModelReject, abstract_hybrid, step_hybrid
from specs.sometimes import Edge
from specs.sometimes_swa import SWA_SOMETIMES
from tools.diff_sglang_hybrid import generate
from tools.hybrid_ops import apply_op
from tools.hybrid_sides import Side

RUNS = [(seed, page) for page in (1, 4) for seed in range(3)] + [(-1, 1), (-2, 1), (-1, 4)]


def run(seed: int, page_size: int, steps: int = 120, log: str | None = None) -> tuple[Side, list]:
    """The kvstate side of one differential seed; its steps as (state before, events, after)."""
    window, interval, ops = generate(seed, steps, page_size)
    side = Side("kvstate", "-", page_size, window)
    engine = side.cache.engine
    recorder = Recorder(engine, log, checkpoint_every=16, fsync=False) if log else None
    steps_seen = []
    for op in ops:
        before, count = engine.state, len(engine.events)
        apply_op(side, op, interval)
        steps_seen.append((before, tuple(engine.events[count:]), engine.state))
    if recorder is not None:
        recorder.close()
    return side, steps_seen


@pytest.mark.parametrize(("seed", "page_size"), RUNS)
def test_backends_model_and_checks_agree(seed, page_size):
    side, steps = run(seed, page_size)
    initial = side.cache.engine.initial_state
    state, live = initial, LiveState.thaw(initial)
    incremental = IncrementalChecker(live)
    model = abstract_hybrid(initial)
    rng = random.Random(seed)
    for _, events, _ in steps:
        for event in events:
            if rng.random() < 0.1:
                _both_refuse(state, model, _corrupt(event, rng))
            state = apply_valid(state, event)
            live.apply(event)
            model = step_hybrid(model, event)
            assert live.fingerprint() == state.fingerprint(), event
            assert abstract_hybrid(state) == model, event
            assert check(state) == [], (event, check(state))
            assert incremental.check() == [], event
    assert state.fingerprint() == side.cache.engine.state.fingerprint()
    assert side.alloc.verify() == [] and side.pool.verify() == []
    _mapped_rows_read_their_peers(side)


def _mapped_rows_read_their_peers(side):
    """Every position a running request still keeps SWA for reads its SWA slot."""
    table = side.alloc.full_to_swa_index_mapping
    peer, size = side.cache.engine.view.swa.peer, side.alloc.page_size
    for req in side.running:
        kv = req.kv
        start = max(kv.get_evicted_seqlen("SWA"), kv.cache_protected_len)
        for position in range(start, kv.kv_allocated_len):
            slot = int(side.pool.req_to_token[kv.req_pool_idx, position])
            assert int(table[slot]) == peer[slot // size] * size + slot % size


def _corrupt(event, rng):
    """The event with one int field nudged (often illegal: both sides must then agree)."""
    fields = list(event.__struct_fields__)
    name = rng.choice(fields)
    value = getattr(event, name)
    if isinstance(value, bool) or not isinstance(value, int):
        return event
    return msgspec.structs.replace(event, **{name: value + rng.choice([1, 2])})


def _both_refuse(state, model, event):
    """The rules and the model accept or refuse ``event`` alike, and agree on the result."""
    try:
        after = apply_valid(state, event)
    except InvalidEvent:
        with pytest.raises(ModelReject):
            step_hybrid(model, event)
        return
    assert abstract_hybrid(after) == step_hybrid(model, event), event


def test_runs_witness_every_sometimes_probe():
    missed = set(SWA_SOMETIMES)
    for seed, page_size in RUNS:
        for before, events, after in run(seed, page_size)[1]:
            edge = Edge(before, events, after)
            missed -= {name for name in missed if SWA_SOMETIMES[name](edge)}
    assert missed == set()


@pytest.mark.parametrize(("seed", "page_size"), [(0, 1), (1, 4), (-1, 1)])
def test_recorded_runs_replay_with_every_check(tmp_path, seed, page_size):
    path = str(tmp_path / "run.kvlog")
    side, _ = run(seed, page_size, log=path)
    result = replay_path(path, check_every=1)
    assert result.ok, result.failure
    assert result.state.fingerprint() == side.cache.engine.state.fingerprint()
    assert result.state.swa is not None


def test_without_a_pool_nothing_changes():
    """No SWA pool: no SWA component on nodes, no SWA part in the encoding."""
    from kvstate.canonical import components
    from kvstate.state import Geometry

    plain = initial_state(Geometry(num_pages=4))
    assert plain.swa is None and all(n.swa is None for n in plain.nodes.values())
    assert not any(name.startswith("swa.") for name, _ in components(plain))
    hybrid = initial_state(Geometry(num_pages=4), swa_pages=2)
    assert [name for name, _ in components(hybrid)][-4:] == [
        "swa.num_pages", "swa.free_pages", "swa.peer", "swa.next_uuid"]
    assert plain.fingerprint() != hybrid.fingerprint()
