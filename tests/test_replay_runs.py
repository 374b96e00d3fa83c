"""The reader's runs of events and the replay loop built on them.

``LogReader.runs()`` hands the replay a whole event block at a time (a lone
event record as a one-event list); ``records()`` and ``events()`` are the
same records flattened.  The replay counts its summary per run, so a run cut
short (``until``, a refused event, a failed check) must count exactly the
events it accepted, on both backends.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from log_helpers import planner_workload

from kvstate.backends.live import LiveState
from kvstate.events import Event, Free
from kvstate.log import LogReader, LogWriter, make_header
from kvstate.log.format import Checkpoint, EndRecord
from kvstate.replay import replay, replay_path
from kvstate.state import Geometry

REPO = Path(__file__).resolve().parent.parent
FORMAT_2 = REPO / "replay" / "format2" / "001_prefix_hit_walkthrough.kvlog"
VLLM = REPO / "replay" / "vllm" / "prefix_caching_b4.kvlog"


def _write(path: Path, geometry: Geometry, events: list[Event], block_events: int,
           checkpoint_every: int = 0) -> None:
    """``events`` in blocks of ``block_events``, a checkpoint every ``checkpoint_every``; the
    events are applied only to fingerprint the checkpoints, so a refused one may be written
    (with no checkpoint after it)."""
    writer = LogWriter(path, make_header(geometry, checkpoint_every=checkpoint_every),
                       fsync=False, block_events=block_events)
    live, valid = LiveState.empty(geometry), True
    for event in events:
        writer.write_event(event)
        try:
            live.apply(event)
        except Exception:  # noqa: BLE001 - the damaged-log test writes a refused event
            valid = False
        if valid and checkpoint_every and writer.count % checkpoint_every == 0:
            writer.write_checkpoint(live.fingerprint())
    writer.close(live.fingerprint() if valid else None)


def _workload_log(tmp_path: Path, block_events: int = 64) -> tuple[Path, list[Event]]:
    geometry, events = planner_workload(requests=12, seed=3)
    assert len(events) > 200
    path = tmp_path / "workload.kvlog"
    _write(path, geometry, events, block_events, checkpoint_every=100)
    return path, events


def test_runs_are_whole_blocks_and_records_flatten_them(tmp_path):
    path, events = _workload_log(tmp_path, block_events=64)
    with LogReader(path) as reader:
        runs = list(reader.runs())
        assert reader.events_read == len(events)
    event_runs = [run for _, run in runs if type(run) is list]
    assert all(1 <= len(run) <= 64 for run in event_runs)
    assert [event for run in event_runs for event in run] == events
    assert type(runs[-1][1]) is EndRecord
    assert any(type(run) is Checkpoint for _, run in runs)
    with LogReader(path) as reader:
        flat = list(reader.records())
    assert flat == [(offset, item) for offset, run in runs
                    for item in (run if type(run) is list else [run])]
    with LogReader(path) as reader:
        assert list(reader.events()) == events


def test_a_format_2_log_gives_one_event_per_run():
    with LogReader(FORMAT_2) as reader:
        runs = [run for _, run in reader.runs()]
    event_runs = [run for run in runs if type(run) is list]
    assert event_runs and all(len(run) == 1 for run in event_runs)
    with LogReader(FORMAT_2) as reader:
        assert [event for run in event_runs for event in run] == list(reader.events())


@pytest.mark.parametrize("backend", ["live", "persistent"])
@pytest.mark.parametrize("until", [0, 1, 63, 64, 65, 150])
def test_a_replay_cut_short_counts_exactly_the_events_it_applied(tmp_path, backend, until):
    path, events = _workload_log(tmp_path, block_events=64)
    result = replay_path(str(path), until=until, backend=backend, check_every=0)
    assert result.stopped_early and result.summary.events == until
    expected = Counter(type(event).TAG for event in events[:until])
    assert result.summary.by_type == dict(expected)
    whole = replay_path(str(path), backend=backend)
    assert whole.ok and whole.summary.by_type == dict(Counter(type(e).TAG for e in events))


@pytest.mark.parametrize("backend", ["live", "persistent"])
def test_a_refused_event_in_the_middle_of_a_block_counts_the_events_before_it(tmp_path, backend):
    geometry, events = planner_workload(requests=8, seed=5)
    bad_at = 40
    damaged = events[:bad_at] + [Free((geometry.num_pages + 7,))] + events[bad_at:]
    path = tmp_path / "damaged.kvlog"
    _write(path, geometry, damaged, block_events=256)
    result = replay_path(str(path), backend=backend, verify=False)
    assert result.failure is not None and result.failure.kind == "invalid_event"
    assert result.failure.event_index == bad_at == result.summary.events
    assert result.summary.by_type == dict(Counter(type(e).TAG for e in events[:bad_at]))


def test_the_final_fingerprint_is_the_end_records_and_the_states(tmp_path):
    path, _ = _workload_log(tmp_path)
    with LogReader(path) as reader:
        result = replay(reader)
        end = reader.end
    assert result.ok and end is not None
    assert result.summary.final_fingerprint == end.fingerprint.hex() == \
        result.state.fingerprint().hex()
    short = replay_path(str(path), until=10)
    assert short.summary.final_fingerprint == short.state.fingerprint().hex()


def test_a_vllm_log_summary_is_the_same_on_both_backends():
    live = replay_path(str(VLLM)).summary.to_json()
    persistent = replay_path(str(VLLM), backend="persistent").summary.to_json()
    for summary in (live, persistent):
        summary.pop("seconds"), summary.pop("events_per_second")
    assert live == persistent
    assert live["peak_pages_used"] > 0 and live["block_hits"] > 0


@pytest.mark.parametrize("options", [{"check_every": -1}, {"check_every": True},
                                     {"check_every": "1"}, {"until": -3}, {"until": 2.5},
                                     {"progress_every": 0}])
def test_absurd_replay_options_are_refused_before_reading(tmp_path, options):
    path, _ = _workload_log(tmp_path)
    with LogReader(path) as reader:
        with pytest.raises(ValueError, match="must be"):
            replay(reader, **options)
        assert reader.events_read == 0  # nothing was read
