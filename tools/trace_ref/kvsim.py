"""Running kvcache-simulator in its own interpreter, for comparison with ``policies``.

kvcache-simulator is not a dependency: the caller names the python of a venv
that has it installed, and ``run_kvcache_simulator`` starts that interpreter
as a subprocess on the trace file (read only) and returns the parsed JSON it
prints, a new dict the caller owns.  Nothing here mutates shared state.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from typing import Any

KVSIM_BLOCKS = (19, 195, 1_000, 1_953, 5_000, 5_859, 10_000, 19_531, 30_000, 50_000, 100_000)

KVSIM_SCRIPT = """
import json, sys
from kvcache_sim.trace import parse_trace_file
from kvcache_sim.plan import build_execution_plan
from kvcache_sim.policies import simulate_ceiling, simulate_policy
trace = parse_trace_file(sys.argv[1], block_size=512)
plan = build_execution_plan(trace, 0.5)
out = {"ceiling": simulate_ceiling(plan).to_json(), "points": []}
for blocks in json.loads(sys.argv[2]):
    out["points"].append({p: simulate_policy(plan, p, blocks).to_json() for p in ("fifo", "lru", "optimal")})
print(json.dumps(out))
"""


def run_kvcache_simulator(python: str, trace: str, blocks: Sequence[int] = KVSIM_BLOCKS) -> Any:
    """kvcache-simulator's ceiling and fifo/lru/optimal points (50% warmup, 512-token blocks)."""
    completed = subprocess.run(
        [python, "-c", KVSIM_SCRIPT, trace, json.dumps(list(blocks))],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(completed.stdout)
