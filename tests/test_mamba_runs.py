"""Seeded Mamba hybrid runs through the front end: both backends, the spec model, the checks, logs.

Each run is the kvstate side of ``tools/diff_sglang_mamba.py`` (bare tree
calls and 0.5.23's request flows on small pools, so copy-on-match, forks,
donations, cascades and every walk happen), for each configuration.  Its
events are then re-applied one by one on the persistent and the live
backend (same fingerprint after each), stepped through the independent
model (``specs.model_mamba``: the same state after each, the same refusals
for corrupted events), checked by every named invariant from scratch and
incrementally (both silent), recorded by the ``Recorder`` and replayed with
a check after every event.
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
from specs.model_mamba import ModelReject, abstract_mamba, sizes, step_mamba
from specs.sometimes import Edge
from specs.sometimes_mamba import MAMBA_SOMETIMES
from tools.diff_sglang_mamba import generate
from tools.mamba_ops import apply_op
from tools.mamba_sides import Side

RUNS = [("mamba-nobuf", 1, 0), ("mamba-nobuf", 1, -1), ("mamba-extra", 1, 1),
        ("mamba-extra", 4, 0), ("mamba-extra", 4, -1), ("mamba-extra", 1, -2),
        ("swa-mamba-nobuf", 1, 2), ("swa-mamba-extra", 4, 3), ("swa-mamba-extra", 1, -2)]


def run(config: str, page_size: int, seed: int, steps: int = 100,
        log: str | None = None) -> tuple[Side, list]:
    """The kvstate side of one differential seed; its steps as (state before, events, after)."""
    setup, ops = generate(config, seed, steps, page_size)
    side = Side("kvstate", "-", setup)
    engine = side.cache.engine
    recorder = Recorder(engine, log, checkpoint_every=16, fsync=False) if log else None
    steps_seen = []
    for op in ops:
        before, count = engine.state, len(engine.events)
        apply_op(side, op)
        steps_seen.append((before, tuple(engine.events[count:]), engine.state))
    if recorder is not None:
        recorder.close()
    return side, steps_seen


@pytest.mark.parametrize(("config", "page_size", "seed"), RUNS)
def test_backends_model_and_checks_agree(config, page_size, seed):
    side, steps = run(config, page_size, seed)
    initial = side.cache.engine.initial_state
    state, live = initial, LiveState.thaw(initial)
    incremental = IncrementalChecker(live)
    model = abstract_mamba(initial)
    rng = random.Random(seed)
    for _, events, _ in steps:
        for event in events:
            if rng.random() < 0.1:
                _both_refuse(state, model, _corrupt(event, rng))
            state = apply_valid(state, event)
            live.apply(event)
            model = step_mamba(model, event)
            assert live.fingerprint() == state.fingerprint(), event
            assert abstract_mamba(state) == model, event
            assert sizes(model) == (state.mamba.evictable, state.mamba.protected), event
            assert check(state) == [], (event, check(state))
            assert incremental.check() == [], event
    assert state.fingerprint() == side.cache.engine.state.fingerprint()
    assert side.pool.verify() == []


def _corrupt(event, rng):
    """The event with one int field nudged (often illegal: both sides must then agree)."""
    name = rng.choice(list(event.__struct_fields__))
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
            step_mamba(model, event)
        return
    assert abstract_mamba(after) == step_mamba(model, event), event


def test_runs_witness_every_sometimes_probe():
    missed = set(MAMBA_SOMETIMES)
    for config, page_size, seed in RUNS:
        for before, events, after in run(config, page_size, seed)[1]:
            edge = Edge(before, events, after)
            missed -= {name for name in missed if MAMBA_SOMETIMES[name](edge)}
        if not missed:
            return
    assert missed == set()


@pytest.mark.parametrize(("config", "page_size", "seed"), [("mamba-extra", 4, 0),
                                                           ("swa-mamba-nobuf", 1, -1)])
def test_recorded_runs_replay_with_every_check(tmp_path, config, page_size, seed):
    path = str(tmp_path / "run.kvlog")
    side, _ = run(config, page_size, seed, log=path)
    result = replay_path(path, check_every=1)
    assert result.ok, result.failure
    assert result.state.fingerprint() == side.cache.engine.state.fingerprint()
    assert result.state.mamba is not None


def test_the_log_header_carries_the_pool():
    from kvstate.log.format import FORMAT_VERSION, LogFormatError, parse_header
    from kvstate.log.writer import make_header
    from kvstate.state import Geometry, initial_state

    geometry = Geometry(num_pages=8, num_rows=2)
    header = make_header(geometry, mamba_slots=5)
    raw = header.to_map()
    assert raw["mamba_slots"] == 5
    assert header.initial_fingerprint == initial_state(geometry, mamba_slots=5).fingerprint()
    assert parse_header(raw, FORMAT_VERSION, 0).mamba_slots == 5
    plain = make_header(geometry).to_map()
    assert "mamba_slots" not in plain and parse_header(plain, FORMAT_VERSION, 0).mamba_slots == 0
    with pytest.raises(LogFormatError, match="mamba_slots"):
        parse_header({**raw, "mamba_slots": 0}, FORMAT_VERSION, 0)
