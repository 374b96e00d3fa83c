"""Logs of runs with a host tier: the header carries the host pool, replay keeps it in the state."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest

from kvstate import Geometry, InvalidEvent, apply
from kvstate.cli import main
from kvstate.events import Load, Offload, ReqAlloc
from kvstate.log.format import FORMAT_VERSION, TIERED_INITIAL, LogFormatError, parse_header
from kvstate.log.reader import LogReader
from kvstate.log.writer import LogWriter, make_header, write_log
from kvstate.planner.host import WRITE_BACK, WRITE_THROUGH
from kvstate.replay.run import replay_path, start_state
from kvstate.state import State, initial_state
from kvstate.workloads.corpus import tiered_offload_and_load

GEOMETRY = Geometry(num_pages=6, page_size=2, num_rows=4, row_width=64)
HOST_PAGES = 8


def tiered_run(policy: str) -> tuple[list, State]:
    """Cache a prompt, evict it to the host, then hit it again (the replay/tiered/ scenario)."""
    geometry, host_pages, events = tiered_offload_and_load(policy)
    assert geometry == GEOMETRY and host_pages == HOST_PAGES
    state = initial_state(GEOMETRY, host_pages=HOST_PAGES)
    for event in events:
        state = apply(state, event)
    return events, state


def tiered_log(tmp_path: Path, policy: str) -> tuple[Path, list, State]:
    """``tiered_run(policy)`` written to ``tmp_path/tiered.kvlog`` with its host tier."""
    events, final = tiered_run(policy)
    path = tmp_path / "tiered.kvlog"
    write_log(path, GEOMETRY, events, host_pages=HOST_PAGES)
    return path, events, final


@pytest.mark.parametrize("policy", [WRITE_THROUGH, WRITE_BACK])
def test_a_tiered_run_replays_with_its_host_tier(tmp_path, policy):
    events, final = tiered_run(policy)
    kinds = {type(event) for event in events}
    assert Offload in kinds and Load in kinds
    path = tmp_path / "tiered.kvlog"
    written = write_log(path, GEOMETRY, events, checkpoint_every=3, host_pages=HOST_PAGES)
    assert written == final
    with LogReader(path) as reader:
        assert reader.header.host_pages == HOST_PAGES
    result = replay_path(str(path))
    assert result.ok, result.failure
    assert result.state.host is not None and result.state.host.num_pages == HOST_PAGES
    assert result.state.fingerprint() == final.fingerprint()
    assert result.summary.events == len(events)
    assert result.summary.checkpoints_verified == len(events) // 3
    assert result.summary.invariant_checks == len(events)
    assert dict(result.state.host.backup) == dict(final.host.backup)


def test_a_plain_log_still_replays_from_a_plain_state(tmp_path):
    path = tmp_path / "plain.kvlog"
    write_log(path, GEOMETRY, [ReqAlloc((1,))])
    result = replay_path(str(path))
    assert result.ok and result.header.host_pages == 0
    assert result.state.host is None


def test_host_events_in_a_log_without_a_host_tier_are_refused(tmp_path):
    events, final = tiered_run(WRITE_THROUGH)
    # the same events under a header without the host tier
    with pytest.raises(InvalidEvent, match="needs a host tier"):
        write_log(tmp_path / "refused.kvlog", GEOMETRY, events)
    plain = tmp_path / "plain.kvlog"
    header = make_header(GEOMETRY)
    assert header.to_map()["initial"] == "empty" and "host_pages" not in header.to_map()
    writer = LogWriter(plain, header, fsync=False)
    writer.write_events(events)
    writer.close(final.fingerprint())
    first_offload = next(i for i, event in enumerate(events) if isinstance(event, Offload))
    result = replay_path(str(plain))
    assert result.failure is not None
    assert result.failure.kind == "invalid_event"
    assert result.failure.event_index == first_offload
    assert "needs a host tier" in result.failure.message


def test_header_host_pages_are_validated():
    good = make_header(GEOMETRY, host_pages=4).to_map()
    assert good["initial"] == TIERED_INITIAL and good["host_pages"] == 4
    assert parse_header(good, FORMAT_VERSION, 10).host_pages == 4
    missing = dict(good)
    del missing["host_pages"]
    with pytest.raises(LogFormatError, match="host_pages has type NoneType"):
        parse_header(missing, FORMAT_VERSION, 10)
    with pytest.raises(LogFormatError, match="needs host_pages > 0"):
        parse_header({**good, "host_pages": 0}, FORMAT_VERSION, 10)
    with pytest.raises(LogFormatError, match="initial state is not tiered"):
        parse_header({**good, "initial": "empty"}, FORMAT_VERSION, 10)
    with pytest.raises(LogFormatError, match="unsupported initial state 'warm'"):
        parse_header({**good, "initial": "warm"}, FORMAT_VERSION, 10)
    # the map packs as plain msgpack
    assert msgpack.unpackb(msgpack.packb(good))["host_pages"] == 4


def test_replay_cli_reports_the_host_tier(tmp_path, capsys):
    path, events, final = tiered_log(tmp_path, WRITE_BACK)
    assert main(["replay", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True
    assert report["final_fingerprint"] == final.fingerprint().hex()
    assert main(["replay", str(path), "--show", "tree"]) == 0
    text = capsys.readouterr().out
    assert f"host tier {HOST_PAGES} pages" in text


@pytest.mark.parametrize("policy", [WRITE_THROUGH, WRITE_BACK])
def test_executor_replay_of_a_tiered_log_moves_and_checks_host_bytes(tmp_path, policy):
    from kvstate.executor import replay_hook

    path, events, _ = tiered_log(tmp_path, policy)
    with LogReader(path) as reader:
        outcome = replay_hook((start_state(reader.header), list(reader.events())), "cpu")
    assert outcome.ok, outcome.message
    assert outcome.events_applied == len(events)
    # 8 tree tokens on the device and their 8 host copies, 2 layers each
    assert outcome.tokens_checked == 2 * 8 * 2


def test_replay_cli_executor_report(tmp_path, capsys):
    path, events, _ = tiered_log(tmp_path, WRITE_BACK)
    # --check-every 0: integrity is verified once, at the end (8 device + 8 host tokens, 2 layers)
    assert main(["replay", str(path), "--executor", "cpu", "--json", "--check-every", "0"]) == 0
    report = json.loads(capsys.readouterr().out)["executor"]
    assert report["ok"] is True and report["tokens_checked"] == 32
    assert report["events_applied"] == len(events)
    assert main(["replay", str(path), "--executor", "cpu", "--check-every", "0"]) == 0
    text = capsys.readouterr().out
    assert "integrity ok in 1 checks" in text and "32 token reads matched their tags" in text
    # by default it is verified after every event as well
    assert main(["replay", str(path), "--executor", "cpu", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["executor"]
    assert report["ok"] is True and report["tokens_checked"] > 32
    assert f"in {len(events) + 1} checks" in report["message"]


def test_executor_replay_catches_a_load_that_moved_no_bytes(tmp_path, monkeypatch, capsys):
    from kvstate.executor import HostPool

    path, events, _ = tiered_log(tmp_path, WRITE_THROUGH)
    monkeypatch.setattr(HostPool, "load_slots", lambda self, host_slots, device_slots: None)
    assert main(["replay", str(path), "--executor", "cpu", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["error"]["kind"] == "executor"
    assert "does not read back its tag" in report["error"]["message"]
