"""Benchmark the Mamba front ends: CPU µs per operation, kvstate vs SGLang 0.5.23, in one run.

    python tools/bench_mamba.py                      # every configuration, 3 repeats
    python tools/bench_mamba.py --configs mamba-extra --steps 3000 --repeats 5
    python tools/bench_mamba.py --page-size 4 --before DIR   # also time the kvstate in DIR

The op lists are ``tools/diff_sglang_mamba.py``'s for one seed, with the
differential's pools, so admissions hit, copy and evict as they do there;
ops run through ``tools/mamba_ops.py`` (SGLang's own scheduler functions on
its side).  The harness (CPU time, interleaved sides in fresh processes,
medians) is ``tools/bench_hybrid.py``; a configuration that does not allow
``--page-size`` runs at page 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_hybrid import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(family="mamba"))
