"""Tamper evidence: checkpoint and end records carry a blake2b of every byte before them.

An edit re-framed with a valid CRC passes the reader's framing checks and
may leave every fingerprint intact (a Split stamp that a later Touch
overwrites); the digest still names the first checkpoint interval it broke.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from log_helpers import planner_workload

from kvstate.cli import main
from kvstate.engine import Engine
from kvstate.events import Event
from kvstate.events.codec import CODEC
from kvstate.log import Checkpoint, EndRecord, LogReader, Recorder, write_log
from kvstate.log.format import BLOCK_PREFIX, FRAME, PREAMBLE_SIZE, frame
from kvstate.log.verify import verify_log
from kvstate.replay import replay_path

REPO = Path(__file__).resolve().parent.parent
EDITED = REPO / "replay" / "failing" / "edited_split_time.kvlog"
FORMAT_1 = REPO / "replay" / "seed" / "000_radix_example.kvlog"


@pytest.fixture(scope="module")
def logged(tmp_path_factory) -> tuple[Path, list[Event]]:
    geometry, events = planner_workload(requests=12, seed=3, page_size=2, capacity=256)
    path = tmp_path_factory.mktemp("digest") / "run.kvlog"
    write_log(path, geometry, events, checkpoint_every=20)
    return path, events


def framing_offsets(path: Path) -> list[tuple[int, Checkpoint | EndRecord]]:
    with LogReader(path) as reader:
        return [(o, i) for o, i in reader.records() if isinstance(i, (Checkpoint, EndRecord))]


def test_each_digest_is_the_blake2b_of_every_byte_before_its_record(logged):
    path, events = logged
    data = path.read_bytes()
    marks = framing_offsets(path)
    assert len(marks) == len(events) // 20 + 1
    for offset, item in marks:
        assert item.digest == hashlib.blake2b(data[:offset], digest_size=16).digest()
    result = replay_path(str(path))
    assert result.ok and result.summary.digests == "verified"
    assert result.summary.digests_verified == len(marks)


def test_a_recorded_run_carries_digests(tmp_path):
    from kvstate.events import Allocate, Free
    from kvstate.state import Geometry

    engine = Engine(Geometry(num_pages=16))
    path = tmp_path / "rec.kvlog"
    with Recorder(engine, path, checkpoint_every=2, flush_bytes=1):
        for page in range(1, 8):
            engine.apply(Allocate((page,)))
        engine.apply(Free((3, 1)))
    found = verify_log(path)
    assert found.digests == "verified" and found.digests_verified == 5 and found.events == 8


def _edit(path: Path, target: Path, index: int, new: Event) -> int:
    """Re-frame the event block holding event ``index`` of ``path`` with that event replaced
    by ``new`` (valid CRC); returns the block's offset."""
    data = path.read_bytes()
    with LogReader(path) as reader:
        located = [(o, item) for o, item in reader.records() if isinstance(item, Event)]
    start = located[index][0]
    block = [item for o, item in located if o == start]
    block[index - [o for o, _ in located].index(start)] = new
    body = bytearray(BLOCK_PREFIX)
    CODEC.encode_plain_list(block, body)
    length, _ = FRAME.unpack_from(data, start)
    target.write_bytes(data[:start] + frame(bytes(body)) + data[start + FRAME.size + length:])
    return start


def test_the_edited_split_time_breaks_only_the_digest(capsys):
    """The corpus entry: every fingerprint matches, the second interval's digest does not."""
    with LogReader(EDITED) as reader:
        items = list(reader.records())
        assert reader.digests == "broken"
        broken = reader.digest_failure
    assert broken is not None and (broken.start_events, broken.events) == (4, 8)
    assert reader.end is not None
    result = replay_path(str(EDITED), verify=False)  # no digest or fingerprint checks
    assert result.ok
    assert result.state.fingerprint() == reader.end.fingerprint  # fingerprints all agree
    assert main(["replay", str(EDITED), "--json"]) == 1
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["kind"] == "digest" and error["byte_offset"] == broken.offset
    assert "checkpoint after event 4" in error["message"]
    assert "checkpoint after event 8" in error["message"]
    assert main(["verify", str(EDITED)]) == 1
    assert "checkpoint after event 8" in capsys.readouterr().err
    assert len(items) > 8


def test_an_edited_header_breaks_the_first_interval(logged, tmp_path):
    path, _ = logged
    data = path.read_bytes()
    length, _ = FRAME.unpack_from(data, PREAMBLE_SIZE)
    body = data[PREAMBLE_SIZE + FRAME.size: PREAMBLE_SIZE + FRAME.size + length]
    edited_body = body.replace(b"kvstate_version", b"kvstate_versioN")
    assert edited_body != body
    edited = tmp_path / "header.kvlog"
    edited.write_bytes(data[:PREAMBLE_SIZE] + frame(edited_body) +
                       data[PREAMBLE_SIZE + FRAME.size + length:])
    result = replay_path(str(edited))
    assert result.failure is not None and result.failure.kind == "digest"
    assert "between the header and the checkpoint after event 20" in result.failure.message


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                   HealthCheck.too_slow])
@given(st.data())
def test_any_reframed_event_edit_is_caught_in_its_interval(logged, tmp_path, data):
    from msgspec.structs import replace

    path, events = logged
    index = data.draw(st.integers(0, len(events) - 1))
    original = events[index]
    name = data.draw(st.sampled_from([n for n in original.__struct_fields__
                                      if isinstance(getattr(original, n), (int, bool))]
                                     or ["<none>"]))
    if name == "<none>":
        return
    value = getattr(original, name)
    new = replace(original, **{name: (not value) if isinstance(value, bool) else value + 1})
    target = tmp_path / "edited.kvlog"
    _edit(path, target, index, new)
    result = replay_path(str(target))
    assert result.failure is not None
    if result.failure.kind == "digest":  # the checks stop at the first broken interval ...
        interval = (index // 20 + 1) * 20
        assert f"after event {min(interval, len(events))}" in result.failure.message
    else:  # ... unless the edited event is refused or fails a check before the interval ends
        assert result.failure.kind in ("invalid_event", "invariant")
        assert result.failure.event_index is not None and result.failure.event_index >= index
    found = verify_log(target)
    assert found.digest_failure is not None


def test_a_format_1_log_replays_but_cannot_be_verified(capsys):
    result = replay_path(str(FORMAT_1))
    assert result.ok and result.summary.digests == "unverified"
    assert main(["replay", str(FORMAT_1)]) == 0
    assert "could not be verified" in capsys.readouterr().out
    assert main(["verify", str(FORMAT_1)]) == 0
    assert main(["verify", str(FORMAT_1), "--require-digests"]) == 1


def test_verify_reports_format_errors_with_exit_2(logged, tmp_path, capsys):
    path, _ = logged
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    broken = tmp_path / "flip.kvlog"
    broken.write_bytes(bytes(data))
    assert main(["verify", str(broken), "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["error"]["kind"] == "format" and "CRC" in out["error"]["message"]
    torn = tmp_path / "torn.kvlog"
    torn.write_bytes(path.read_bytes()[:-5])
    assert main(["verify", str(torn)]) == 2
    assert main(["verify", str(path), "--json"]) == 0
    good = json.loads(capsys.readouterr().out)
    assert good["digests"] == "verified" and good["bytes"] == path.stat().st_size


@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
def test_verify_and_the_reader_agree_whatever_the_chunk_size(logged, chunk):
    path, events = logged
    found = verify_log(path, chunk_bytes=chunk)
    assert (found.events, found.digests, found.digests_verified) == (
        len(events), "verified", len(events) // 20 + 1)
    with LogReader(path, chunk_bytes=chunk) as reader:
        list(reader.records())
        assert reader.digests_verified == found.digests_verified
    found = verify_log(EDITED, chunk_bytes=chunk)
    assert found.digest_failure is not None and found.digest_failure.events == 8
