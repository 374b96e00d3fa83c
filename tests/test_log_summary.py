"""Numbers a user meets: prompt accounting for every front end, units, and diff's focus.

``prompt_tokens``, ``prefix_hit_tokens``, ``computed_prompt_tokens`` and
``prefix_hit_rate = prefix_hit_tokens / prompt_tokens`` must come out the
same whichever front end made the log; the expected numbers here come from
the front end itself (what ``match_prefix`` returned), not from the replay.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from log_helpers import planner_workload

from kvstate.cli import main
from kvstate.events import Allocate
from kvstate.log import Recorder, write_log
from kvstate.log.limits import TOKENS_PER_SLOT
from kvstate.replay import replay_path
from kvstate.state import Geometry

REPO = Path(__file__).resolve().parent.parent


def _sglang_api_script(path: Path) -> tuple[int, int]:
    """Eight requests through SGLang's API (``alloc``, ``pool.write``, ``cache_finished_req``)
    sharing system prompts; returns (prompt tokens, tokens ``match_prefix`` hit)."""
    from sglang_helpers import admit, build

    from kvstate.sglang import Req

    pool, allocator, cache = build(num_tokens=1024, rows=8, width=256)
    systems = [list(range(100, 140)), list(range(200, 230))]
    prompts = [systems[i % 2] + [300 + 10 * i + k for k in range(5 + i)] for i in range(8)]
    prompt_tokens = hits = 0
    with Recorder(cache, path, checkpoint_every=16):
        for index, prompt in enumerate(prompts):
            req = Req(f"r{index}", prompt)
            admit(pool, allocator, cache, req)
            prompt_tokens += len(req.fill_ids)
            hits += len(req.prefix_indices)
            cache.cache_finished_req(req)
    return prompt_tokens, hits


def test_an_sglang_api_log_counts_every_admitted_prompt_token(tmp_path, capsys):
    path = tmp_path / "sglang.kvlog"
    prompt_tokens, hits = _sglang_api_script(path)
    assert 0 < hits < prompt_tokens
    assert main(["replay", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["prompt_tokens"] == prompt_tokens
    assert summary["prefix_hit_tokens"] == hits
    assert summary["computed_prompt_tokens"] == prompt_tokens - hits
    assert summary["prefix_hit_rate"] == round(hits / prompt_tokens, 6)
    assert main(["replay", str(path)]) == 0
    text = capsys.readouterr().out
    assert f"prompt tokens   {prompt_tokens} ({hits} prefix hits, {prompt_tokens - hits} computed)" \
        in text
    assert f"{hits / prompt_tokens:.1%} of prompt tokens" in text


def test_the_planner_and_the_sglang_api_orders_count_alike(tmp_path):
    """The same requests, admitted with Allocate(items) or Allocate + Assign, count the same
    (no eviction: both runs see the same hits)."""
    totals = []
    for api in (False, True):
        geometry, events = planner_workload(requests=10, seed=4, page_size=1, capacity=4096,
                                            rows=1, sglang_api=api)
        path = tmp_path / f"{api}.kvlog"
        write_log(path, geometry, events)
        summary = replay_path(str(path)).summary
        totals.append((summary.requests, summary.prompt_tokens, summary.prefix_hit_tokens))
    assert totals[0] == totals[1] and totals[0][2] > 0


def test_an_undone_admission_counts_nothing(tmp_path):
    from kvstate.events import Assign, Insert, ReqAlloc, ReqFree

    events = [Allocate((1, 2, 3)), Insert(0, (7, 8, 9), (1, 2, 3), 1, 1, 0),
              ReqAlloc((1,)), Assign(1, 0, (1, 2)), ReqFree((1,)),  # admission undone
              ReqAlloc((2,)), Assign(2, 0, (1, 2)), Allocate((4,), ((2, (4,)),))]
    path = tmp_path / "undone.kvlog"
    write_log(path, Geometry(num_pages=8, num_rows=2, row_width=16), events)
    summary = replay_path(str(path)).summary
    assert (summary.prompt_tokens, summary.prefix_hit_tokens) == (3, 2)


def test_a_vllm_log_counts_whole_blocks_and_says_so(capsys):
    log = str(REPO / "replay" / "vllm" / "prefix_caching_b4.kvlog")
    assert main(["replay", log, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    # six 11-token prompts in 4-token blocks: 3 blocks each; four of them hit a 2-block stem
    assert summary["granularity"] == "block of 4 tokens"
    assert summary["prompt_tokens"] == 6 * 3 * 4
    assert summary["prefix_hit_tokens"] == 4 * 2 * 4 == summary["block_hits"] * 4
    assert main(["replay", log]) == 0
    assert "(32 prefix hits, 40 computed; counted in whole blocks of 4 tokens)" in \
        capsys.readouterr().out


def test_tokens_per_slot_scales_and_labels_the_counts(tmp_path, capsys):
    geometry = Geometry(num_pages=16, page_size=1, num_rows=2, row_width=16)
    from kvstate.events import Append, ReqAlloc

    events = [ReqAlloc((1,)), Allocate((1, 2), ((1, (1, 2)),)), Append(((1, 2),))]
    path = tmp_path / "sim.kvlog"
    write_log(path, geometry, events, meta={TOKENS_PER_SLOT: 512})
    assert main(["replay", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["prompt_tokens"] == 2 * 512
    assert summary["granularity"] == "slot of 512 tokens"
    assert main(["replay", str(path)]) == 0
    text = capsys.readouterr().out
    assert "16 pages x 1 slots of 512 tokens (512 tokens per page)" in text
    bad = tmp_path / "bad.kvlog"
    write_log(bad, geometry, events, meta={TOKENS_PER_SLOT: 0})
    assert main(["replay", str(bad)]) == 2


@pytest.mark.parametrize("position", [3, 150, 290])
def test_diff_shows_the_element_where_two_events_differ(tmp_path, capsys, position):
    geometry = Geometry(num_pages=400)
    pages = tuple(range(1, 301))
    other = pages[:position] + (399,) + pages[position + 1:]
    a, b = tmp_path / "a.kvlog", tmp_path / "b.kvlog"
    write_log(a, geometry, [Allocate(pages)])
    write_log(b, geometry, [Allocate(other)])
    assert main(["diff", str(a), str(b)]) == 1
    text = capsys.readouterr().out
    assert f"differs at Allocate.pages[{position}]: {position + 1} in A, 399 in B" in text
    line_a = next(line for line in text.splitlines() if line.startswith("  A: "))
    line_b = next(line for line in text.splitlines() if line.startswith("  B: "))
    assert f" {position + 1}," in line_a and " 399," in line_b
    assert main(["diff", str(a), str(b), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["event_difference"].startswith(f"Allocate.pages[{position}]")
