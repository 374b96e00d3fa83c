"""Every log committed under replay/ replays to its expected outcome and final fingerprint.

Each ``X.kvlog`` has an ``X.kvlog.expect.json`` sidecar (written by
``tools/make_replay_corpus.py``): the exit code ``kvstate replay`` must give,
the event and request counts, the final fingerprint, and for failing logs
the failure's kind, check and event index or byte offset.  This is also the
golden test for old formats: a log written by any released format version
must keep replaying here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstate.cli import main
from kvstate.log import read_header

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "replay"
LOGS = sorted(CORPUS.rglob("*.kvlog"))


def test_the_corpus_has_every_kind_of_entry():
    names = {p.relative_to(CORPUS).as_posix() for p in LOGS}
    assert "seed/000_radix_example.kvlog" in names
    assert "seed/001_prefix_hit_walkthrough.kvlog" in names
    assert any(n.startswith("synthetic/") for n in names)
    outcomes = {json.loads(Path(str(p) + ".expect.json").read_text())["exit"] for p in LOGS}
    assert outcomes == {0, 1, 2}
    readme = (CORPUS / "README.md").read_text(encoding="utf-8")
    for name in names:
        assert name in readme, f"replay/README.md does not describe {name}"


def test_the_corpus_stays_small():
    assert sum(p.stat().st_size for p in CORPUS.rglob("*") if p.is_file()) < 2 * 1024 * 1024


@pytest.mark.parametrize("path", LOGS, ids=[p.relative_to(CORPUS).as_posix() for p in LOGS])
def test_corpus_log_replays_to_its_expected_outcome(path, capsys):
    expect = json.loads(Path(str(path) + ".expect.json").read_text(encoding="utf-8"))
    code = main(["replay", str(path), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == expect["exit"]
    assert out["ok"] is (expect["exit"] == 0)
    if "error" in expect:
        for key, value in expect["error"].items():
            assert out["error"][key] == value, key
    else:
        assert "error" not in out
    if out["final_fingerprint"] is not None:
        assert out["final_fingerprint"] == expect["final_fingerprint"]
        assert out["events"] == expect["events"]
        assert out["requests"] == expect["requests"]


@pytest.mark.parametrize("path", [p for p in LOGS if "malformed" not in p.parts],
                         ids=lambda p: p.name)
def test_corpus_headers_are_readable(path):
    header = read_header(path)
    assert header.format_version >= 1
    assert header.geometry.num_pages > 0
