"""The ``kvstate replay | record | diff | minimize | verify`` commands: exit codes, JSON, printouts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstate.cli import build_parser, main
from kvstate.commands.replay import DEMO_NAME, demo_bytes
from kvstate.log import read_events, read_header

REPO = Path(__file__).resolve().parent.parent
SEED_000 = str(REPO / "replay" / "seed" / "000_radix_example.kvlog")
SEED_001 = str(REPO / "replay" / "seed" / "001_prefix_hit_walkthrough.kvlog")
DOUBLE_FREE = str(REPO / "replay" / "failing" / "double_free.kvlog")
BAD_CHECKPOINT = str(REPO / "replay" / "failing" / "bad_checkpoint.kvlog")
BIT_FLIP = str(REPO / "replay" / "malformed" / "bit_flip.kvlog")
TORN = str(REPO / "replay" / "malformed" / "torn_tail.kvlog")


def expected_offset(path: str) -> int:
    """The byte offset the corpus sidecar records for a malformed log."""
    return json.loads(Path(path + ".expect.json").read_text())["error"]["byte_offset"]


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


@pytest.mark.parametrize("command", ["replay", "record", "diff", "minimize", "verify"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    assert command in capsys.readouterr().out


def test_replay_without_a_log_replays_the_bundled_demo(capsys):
    assert main(["replay"]) == 0
    out = capsys.readouterr().out
    assert DEMO_NAME in out and ": ok" in out
    for label in ("events", "requests", "peak pages used", "prompt tokens", "prefix hits",
                  "evictions", "digests", "fingerprint", "events/s"):
        assert label in out
    assert demo_bytes() == (REPO / "replay" / "synthetic" / "demo_sglang_p4.kvlog").read_bytes()


def test_replay_json_keys_for_a_clean_log(capsys):
    code, out = run_json(capsys, "replay", SEED_001)
    assert code == 0
    assert out["ok"] is True and "error" not in out
    assert out["events"] == 17 and out["requests"] == 1
    assert len(out["final_fingerprint"]) == 32
    int(out["final_fingerprint"], 16)
    assert out["summary"]["prefix_hit_tokens"] == 3  # slots [42, 17, 88]
    assert out["summary"]["computed_prompt_tokens"] == 2  # slots [5, 9]
    assert out["summary"]["prompt_tokens"] == 5
    assert out["summary"]["prefix_hit_rate"] == 0.6
    assert out["summary"]["granularity"] == "token"
    assert out["summary"]["digests"] == "unverified"  # a format 1 log


def test_replay_invalid_event_exits_1_naming_index_event_and_check(capsys):
    code, out = run_json(capsys, "replay", DOUBLE_FREE)
    assert code == 1 and out["ok"] is False
    error = out["error"]
    assert error["kind"] == "invalid_event" and error["event_index"] == 17
    assert "Free(pages=(1,)" in error["event"] and "already free" in error["message"]
    assert main(["replay", DOUBLE_FREE]) == 1
    err = capsys.readouterr().err
    assert "event #17" in err and "Free(pages=(1,)" in err and "already free" in err


def test_replay_fingerprint_mismatch_exits_1(capsys):
    code, out = run_json(capsys, "replay", BAD_CHECKPOINT)
    assert code == 1
    assert out["error"]["kind"] == "fingerprint" and out["error"]["check"] == "checkpoint"
    assert out["error"]["event_index"] == 3


def test_replay_malformed_exits_2_naming_the_byte_offset(capsys):
    code, out = run_json(capsys, "replay", BIT_FLIP)
    assert code == 2
    assert out["error"]["kind"] == "format" and out["error"]["byte_offset"] == expected_offset(BIT_FLIP)
    assert "CRC" in out["error"]["message"]
    assert main(["replay", TORN]) == 2
    assert f"byte {expected_offset(TORN)}:" in capsys.readouterr().err


def test_replay_header_damage_exits_2(tmp_path, capsys):
    empty = tmp_path / "empty.kvlog"
    empty.write_bytes(b"")
    code, out = run_json(capsys, "replay", str(empty))
    assert code == 2 and out["error"] == {"kind": "format", "message": "empty file", "byte_offset": 0}
    assert main(["replay", str(tmp_path / "missing.kvlog")]) == 2


def test_replay_salvage_replays_the_valid_prefix(capsys):
    code, out = run_json(capsys, "replay", TORN, "--salvage")
    assert code == 0 and out["ok"] is True
    assert out["events"] == 9
    assert out["salvage"]["byte_offset"] == expected_offset(TORN)
    assert "truncated" in out["salvage"]["reason"]
    assert main(["replay", TORN, "--salvage"]) == 0
    assert f"stopped at byte {expected_offset(TORN)}:" in capsys.readouterr().out


def test_replay_until_and_show(capsys):
    code, out = run_json(capsys, "replay", SEED_001, "--until", "8", "--show", "req", "1")
    assert code == 0 and out["events"] == 8 and out["stopped_early"] is True
    assert "request 1: allocated 5, committed 0" in out["show"]
    assert "slots: [42, 17, 88, 5, 9]" in out["show"]
    assert main(["replay", SEED_001, "--until", "8", "--show", "tree"]) == 0
    text = capsys.readouterr().out
    assert "#1 len=3 key=[101, 102, 103] pages=[42,17,88] lock=1" in text
    assert main(["replay", SEED_001, "--until", "8", "--show", "pages"]) == 0
    text = capsys.readouterr().out
    assert "tree (3): 17,42,88" in text and "request 1 (2): 5,9" in text
    assert main(["replay", SEED_001, "--show", "state"]) == 0
    assert "seq 17" in capsys.readouterr().out
    assert main(["replay", SEED_001, "--show", "req", "3"]) == 0
    assert "is not open" in capsys.readouterr().out


def test_replay_show_tree_of_the_radix_example(capsys):
    assert main(["replay", SEED_000, "--until", "10", "--show", "tree"]) == 0
    lines = capsys.readouterr().out.splitlines()
    tree = lines[lines.index(next(line for line in lines if line.startswith("root"))):]
    assert tree == [
        "root  tokens=7 (evictable 3, protected 4)",
        "  #2 len=3 key=[1, 2, 3] pages=[1-3] lock=1 t=6",
        "    #1 len=2 key=[4, 5] pages=[4-5] lock=0 t=3",
        "    #4 len=1 key=[6] pages=[6] lock=1 t=7",
        "      #3 len=1 key=[7] pages=[7] lock=0 t=6",
    ]


def test_show_takes_several_views_in_order(capsys):
    assert main(["replay", SEED_001, "--until", "8", "--show", "state", "req", "1", "pages"]) == 0
    out = capsys.readouterr().out
    state, request, pages = out.index("seq 8 "), out.index("request 1: allocated"), out.index("head first")
    assert state < request < pages


@pytest.mark.parametrize("argv", [["--show", "nodes"], ["--show", "req"], ["--show", "tree", "x"],
                                  ["--check-every", "-1"], ["--until", "-2"]])
def test_replay_usage_errors_exit_2(argv, capsys):
    assert main(["replay", SEED_000, *argv]) == 2


def test_replay_check_every_thins_the_checks(capsys):
    code, every = run_json(capsys, "replay", SEED_001)
    code, thin = run_json(capsys, "replay", SEED_001, "--check-every", "5")
    assert every["summary"]["invariant_checks"] == 17
    assert thin["summary"]["invariant_checks"] == 4  # 5, 10, 15 and the final state
    code, none = run_json(capsys, "replay", SEED_001, "--check-every", "0")
    assert none["summary"]["invariant_checks"] == 0
    assert thin["final_fingerprint"] == every["final_fingerprint"] == none["final_fingerprint"]


def test_replay_executor_option(capsys):
    import importlib.util

    code = main(["replay", SEED_000, "--executor", "cpu"])
    if importlib.util.find_spec("kvstate.executor") is None:
        assert code == 2
        assert "kvstate.executor" in capsys.readouterr().err
    else:
        assert code == 0


def test_replay_executor_cuda_without_a_device_exits_2(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert main(["replay", SEED_000, "--executor", "cuda"]) == 2
    assert "CUDA" in capsys.readouterr().err


@pytest.mark.cuda
def test_replay_executor_cuda(capsys):
    assert main(["replay", SEED_001, "--executor", "cuda"]) == 0


def test_record_then_replay_then_diff(tmp_path, capsys):
    a, b, c = (str(tmp_path / n) for n in ("a.kvlog", "b.kvlog", "c.kvlog"))
    code, rec = run_json(capsys, "record", "--workload", "synthetic", "--requests", "12", "--seed",
                         "3", "--page-size", "4", "--capacity", "512", "-o", a)
    assert code == 0 and rec["requests"] == 12
    assert main(["record", "--requests", "12", "--seed", "3", "--page-size", "4", "--capacity",
                 "512", "-o", b]) == 0
    assert main(["record", "--requests", "12", "--seed", "4", "--page-size", "4", "--capacity",
                 "512", "-o", c]) == 0
    capsys.readouterr()
    assert Path(a).read_bytes() == Path(b).read_bytes()
    header = read_header(a)
    assert header.meta["seed"] == 3 and header.geometry.page_size == 4
    assert header.geometry.num_pages == 128
    code, out = run_json(capsys, "replay", a)
    assert code == 0 and out["events"] == rec["events"]
    assert out["final_fingerprint"] == rec["final_fingerprint"]
    code, same = run_json(capsys, "diff", a, b)
    assert code == 0 and same["identical"] is True
    code, diff = run_json(capsys, "diff", a, c)
    assert code == 1 and diff["identical"] is False
    events_a, events_c = read_events(a)[1], read_events(c)[1]
    first = next(i for i, (x, y) in enumerate(zip(events_a, events_c, strict=False)) if x != y)
    assert diff["event_index"] == first
    assert diff["state_index"] == first and diff["state_difference"]
    assert main(["diff", a, c]) == 1
    assert f"first event divergence at event #{first}" in capsys.readouterr().out


def test_record_rejects_a_capacity_too_small(tmp_path, capsys):
    assert main(["record", "--requests", "3", "--capacity", "16", "-o", str(tmp_path / "x")]) == 2
    assert "capacity" in capsys.readouterr().err


def test_diff_of_a_malformed_log_exits_2(capsys):
    assert main(["diff", SEED_000, BIT_FLIP]) == 2


def test_diff_reports_a_refused_event(capsys):
    code, out = run_json(capsys, "diff", SEED_001, DOUBLE_FREE)
    assert code == 1
    assert out["event_index"] == 17 and out["event_a"] is None
    assert "already free" in out["state_difference"]


def test_minimize_cli(tmp_path, capsys):
    out_path = str(tmp_path / "min.kvlog")
    code, out = run_json(capsys, "minimize", DOUBLE_FREE, "-o", out_path)
    assert code == 0 and out["events"] == 1 and out["original_events"] == 18
    code, replayed = run_json(capsys, "replay", out_path)
    assert code == 1 and replayed["error"]["kind"] == "invalid_event"
    assert main(["minimize", SEED_000, "-o", str(tmp_path / "none.kvlog")]) == 1
    assert main(["minimize", BIT_FLIP, "-o", str(tmp_path / "bad.kvlog")]) == 2


def test_parser_builds_with_all_commands():
    parser = build_parser()
    args = parser.parse_args(["replay", "--show", "req", "7"])
    assert args.show == ["req", "7"] and callable(args.func)


def test_a_vllm_log_summary_counts_blocks(capsys):
    log = str(Path(__file__).resolve().parent.parent / "replay" / "vllm" / "prefix_caching_b4.kvlog")
    assert main(["replay", log]) == 0
    text = capsys.readouterr().out
    assert "8 cached blocks taken by requests, 16 blocks allocated" in text
    assert "2 cached blocks evicted (lazily, on reuse)" in text
    code, report = run_json(capsys, "replay", log)
    assert code == 0 and report["summary"]["block_hits"] == 8
    assert report["summary"]["blocks_uncached"] == 2


def test_backend_choice_is_reported_and_gives_the_same_answer(capsys):
    log = str(REPO / "replay" / "synthetic" / "sglang_p4_s11_tight.kvlog")
    outs = {}
    for extra in ((), ("--backend", "persistent"), ("--full-checks",),
                  ("--check-every", "0"), ("--backend", "persistent", "--check-every", "7")):
        code, out = run_json(capsys, "replay", log, *extra)
        assert code == 0
        outs[extra] = out
    assert outs[()]["backend"] == "live"
    assert outs[("--backend", "persistent")]["backend"] == "persistent"
    assert len({out["final_fingerprint"] for out in outs.values()}) == 1
    assert outs[()]["summary"]["invariant_checks"] == outs[()]["events"]
    for extra in (("--backend", "persistent"), ("--full-checks",)):
        assert outs[extra]["summary"]["invariant_checks"] == outs[()]["events"]
    vllm_log = str(REPO / "replay" / "vllm" / "prefix_caching_b4.kvlog")
    tiered_log = str(REPO / "replay" / "tiered" / "write_back_hit.kvlog")
    for other in (vllm_log, tiered_log):
        answers = {run_json(capsys, "replay", other, *extra)[1]["final_fingerprint"]
                   for extra in ((), ("--backend", "persistent"))}
        assert len(answers) == 1
    with pytest.raises(SystemExit) as info:
        main(["replay", log, "--backend", "frozen"])
    assert info.value.code == 2


@pytest.mark.parametrize("argv", [["replay", SEED_000, "--show", "tree"], ["diff", SEED_000, SEED_001],
                                  ["verify", SEED_001], ["replay", SEED_001, "--json"]])
def test_a_closed_pipe_ends_a_command_quietly(argv, tmp_path):
    """``kvstate replay LOG | head``: the reader is gone before the first line; no traceback,
    and the command's own exit code."""
    import os
    import subprocess
    import sys

    runner = REPO / "tests" / "adversarial" / "run_command.py"
    env = {**os.environ, "PYTHONPATH": os.environ.get("KVSTATE_CODE_ROOT", str(REPO))}
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will read: every write fails with EPIPE
    try:
        done = subprocess.run([sys.executable, str(runner), str(tmp_path / "rss"), *argv],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, env=env,
                              timeout=120, check=False)
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == (1 if argv[0] == "diff" else 0)
