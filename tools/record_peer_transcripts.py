"""Record the peers' side of the hybrid differentials as test data.

    python tools/record_peer_transcripts.py            # needs ../shared/peers set up
    python tools/record_peer_transcripts.py --check    # only say whether the files are current

The three hybrid differentials (``diff_sglang_hybrid.py``, ``diff_sglang_mamba.py``,
``diff_vllm_hybrid.py``) run the same op lists on kvstate and on the real SGLang 0.5.23 and
vLLM 0.33, and need the peers' virtual environments.  This tool runs the peers once on a
fixed set of those op lists (the directed scripts and five (SGLang) or eight (vLLM)
random seeds per configuration; SGLang with its Python tree core, whose snapshots
include the tree) and writes what they
returned to ``tests/data/peer_transcripts/`` (gzip-compressed JSON, one file per
configuration).  ``tests/test_peer_transcripts.py`` replays kvstate's side of each op list
and requires the very same trace, so CI checks kvstate's hybrid decisions against the
peers' recorded ones without installing them.

Each file holds the generator's arguments and a SHA-256 digest of the op lists it
produced, so a test can tell "the generator changed: record again" from "kvstate's
decisions changed".  Record again only after changing a generator or a side's snapshot.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
DATA = HERE.parent / "tests" / "data" / "peer_transcripts"
STEPS = 120  # ops per SGLang seed
VLLM_OPS = 100  # calls per vLLM seed
RANDOM_SEEDS = (0, 1, 2, 3, 4)  # per SGLang configuration
VLLM_SEEDS = tuple(range(8))  # per vLLM layout and block size (Mamba align paths are rarer)


def sets() -> dict[str, dict[str, Any]]:
    """File name -> what it records (family, configuration, seeds, length)."""
    from diff_sglang_mamba import CONFIGS

    out: dict[str, dict[str, Any]] = {}
    for page in (1, 4):
        directed = [-1, -2] if page == 1 else [-1]
        out[f"sglang-swa-p{page}"] = {"family": "sglang-swa", "page_size": page,
                                      "seeds": [*directed, *RANDOM_SEEDS], "steps": STEPS}
    for config, (_, _, pages) in CONFIGS.items():
        for page in pages:
            out[f"sglang-{config}-p{page}"] = {"family": "sglang-mamba", "config": config,
                                               "page_size": page,
                                               "seeds": [-1, -2, *RANDOM_SEEDS], "steps": STEPS}
    for layout in ("swa", "mamba", "swa+mamba"):
        for size in (1, 16):
            out[f"vllm-{layout.replace('+', '-')}-bs{size}"] = {
                "family": "vllm-hybrid", "layout": layout, "block_size": size,
                "seeds": list(VLLM_SEEDS), "steps": VLLM_OPS}
    out["vllm-directed"] = {"family": "vllm-hybrid-directed", "seeds": [], "steps": 0}
    return out


def op_lists(spec: dict[str, Any]) -> dict[str, Any]:
    """The op lists (vLLM: jobs with their configuration) a set runs, keyed by seed."""
    family = spec["family"]
    if family == "sglang-swa":
        from diff_sglang_hybrid import generate as generate_swa

        return {str(seed): generate_swa(seed, spec["steps"], spec["page_size"])
                for seed in spec["seeds"]}
    if family == "sglang-mamba":
        from diff_sglang_mamba import generate as generate_mamba

        return {str(seed): generate_mamba(spec["config"], seed, spec["steps"], spec["page_size"])
                for seed in spec["seeds"]}
    from diff_vllm_hybrid import directed_jobs, make_config, make_ops

    if family == "vllm-hybrid-directed":
        return {str(index): job for index, job in enumerate(directed_jobs())}
    out = {}
    for seed in spec["seeds"]:
        config = make_config(seed, spec["layout"], spec["block_size"])
        out[str(seed)] = {"config": config, "ops": make_ops(seed, spec["steps"], spec["block_size"],
                                                           config["num_blocks"])}
    return out


def digest(lists: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(lists, sort_keys=True).encode()).hexdigest()


def record(name: str, spec: dict[str, Any], peers: Path) -> dict[str, Any]:
    """Run the peer on one set; the file's content."""
    family = spec["family"]
    lists = op_lists(spec)
    if family.startswith("sglang"):
        python = str(peers / "venv-sglang" / "bin" / "python")
        seeds = ",".join(lists)
        if family == "sglang-swa":
            command = [python, str(HERE / "hybrid_sides.py"), "sglang", "python",
                       str(spec["page_size"]), seeds, str(spec["steps"])]
        else:
            command = [python, str(HERE / "mamba_sides.py"), "sglang", "python", spec["config"],
                       str(spec["page_size"]), seeds, str(spec["steps"])]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        traces = {str(seed): trace for seed, trace in
                  (json.loads(line) for line in done.stdout.splitlines() if line.startswith("["))}
        peer = "SGLang 0.5.23, Python tree core"
    else:
        python = str(peers / "venv-vllm" / "bin" / "python")
        env = dict(os.environ, PYTHONWARNINGS="ignore", VLLM_LOGGING_LEVEL="ERROR")
        done = subprocess.run([python, str(HERE / "diff_vllm_hybrid.py"), "--vllm-side"],
                              input=json.dumps(list(lists.values())), capture_output=True,
                              text=True, env=env, check=False)
        traces = dict(zip(lists, json.loads(done.stdout), strict=True)) if not done.returncode \
            else {}
        peer = "vLLM 0.33"
    if set(traces) != set(lists):
        raise RuntimeError(f"{name}: the peer failed:\n{done.stderr[-3000:]}")
    return {"name": name, "peer": peer, "spec": spec, "ops_digest": digest(lists),
            "traces": traces}


def load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="utf-8") as file:
        return dict(json.load(file))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="only report files missing or recorded from other op lists")
    parser.add_argument("--only", default="", help="comma-separated set names")
    args = parser.parse_args(argv)
    peers = Path(os.environ.get("PEERS", Path.home() / "kvstate-peers"))
    wanted = [name for name in args.only.split(",") if name]
    stale = 0
    DATA.mkdir(parents=True, exist_ok=True)
    for name, spec in sets().items():
        if wanted and name not in wanted:
            continue
        path = DATA / f"{name}.json.gz"
        if args.check:
            current = path.exists() and load(path)["ops_digest"] == digest(op_lists(spec))
            stale += not current
            print(f"{name}: {'current' if current else 'missing or stale'}")
            continue
        content = record(name, spec, peers)
        with gzip.GzipFile(path, "wb", mtime=0) as file:  # mtime 0: the same bytes every time
            file.write(json.dumps(content, sort_keys=True).encode())
        print(f"{name}: {len(content['traces'])} op lists, {path.stat().st_size:,} bytes")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
