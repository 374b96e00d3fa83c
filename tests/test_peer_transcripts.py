"""kvstate's hybrid decisions against the peers' own, recorded (no peer install needed).

``tests/data/peer_transcripts/`` holds what SGLang 0.5.23 (Python tree core) and vLLM 0.33
returned on fixed op lists of the three hybrid differentials: per op its result and a
snapshot (slot and block ids, free lists in order, sizes per component, hits, branching
seqlens, locks, the tree; vLLM: per-group tables, ``ref_cnt``, the free queue, the KV events
and their bytes).  ``tools/record_peer_transcripts.py`` wrote them from the real peers.  Here
kvstate's side runs the same op lists (every named invariant checked after each op) and
must produce the same trace; the full random runs against the live peers are
``tools/diff_sglang_hybrid.py``, ``diff_sglang_mamba.py`` and ``diff_vllm_hybrid.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tools.diff_sglang_hybrid import first_divergence
from tools.diff_vllm_hybrid import compare, kvstate_side
from tools.hybrid_sides import run_seed as run_swa
from tools.mamba_sides import run_seed as run_mamba
from tools.record_peer_transcripts import DATA, digest, load, op_lists, sets

FILES = sorted(DATA.glob("*.json.gz"))


def test_every_recorded_set_is_shipped():
    assert sorted(path.name for path in FILES) == sorted(f"{name}.json.gz" for name in sets())


def _ours(spec: dict[str, Any], key: str, lists: dict[str, Any], workdir: Path) -> Any:
    family = spec["family"]
    if family == "sglang-swa":
        return run_swa("kvstate", "-", spec["page_size"], int(key), spec["steps"])
    if family == "sglang-mamba":
        return run_mamba("kvstate", "-", spec["config"], spec["page_size"], int(key),
                         spec["steps"])
    job = lists[key]
    trace, problems = kvstate_side(job["config"], job["ops"], str(workdir))
    assert problems == [], problems[:1]  # the recorded log replays to the same state
    return trace


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.name.removesuffix(".json.gz"))
def test_kvstate_makes_the_recorded_peer_decisions(path, tmp_path):
    content = load(path)
    spec = content["spec"]
    lists = op_lists(spec)
    assert digest(lists) == content["ops_digest"], (
        f"{path.name} was recorded from other op lists (a generator changed): "
        "run tools/record_peer_transcripts.py with the peers installed")
    for key, theirs in content["traces"].items():
        ours = json.loads(json.dumps(_ours(spec, key, lists, tmp_path)))
        if spec["family"].startswith("sglang"):
            problem = first_divergence(ours, theirs)
        else:
            problem = compare(ours, theirs)
        assert problem is None, f"{content['peer']}, {path.name}, op list {key}: {problem}"
