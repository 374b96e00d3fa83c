"""Run the peers' shared driver (``sim.py``) timing each phase in this thread's CPU time.

    python tools/peer_cpu_sim.py SIM_PY [sim.py's arguments]

The driver sums ``time.perf_counter`` differences per phase.  On a shared
machine wall time charges every peer for the other processes' load, and a
peer with background threads (SGLang starts torch's) for its own threads
too; ``time.thread_time`` counts only the driver's thread, so the same
workload gives the same number whatever else runs.  Nothing else changes:
same driver, same phases, same metrics.
"""

from __future__ import annotations

import os
import runpy
import sys
import time


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    sim_path = sys.argv[1]
    time.perf_counter = time.thread_time  # the driver binds perf_counter when a run starts
    sys.argv = [sim_path, *sys.argv[2:]]
    sys.path[0] = os.path.dirname(os.path.abspath(sim_path))  # as `python sim.py` would see it
    runpy.run_path(sim_path, run_name="__main__")


if __name__ == "__main__":
    main()
