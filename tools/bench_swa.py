"""Benchmark the FULL + SWA front end: CPU µs per operation, kvstate vs SGLang 0.5.23, in one run.

    python tools/bench_swa.py                        # page 1, 3 interleaved repeats
    python tools/bench_swa.py --page-size 4 --repeats 5
    python tools/bench_swa.py --before DIR           # also time the kvstate package in DIR

The op lists are ``tools/diff_sglang_hybrid.py``'s (admissions with their
prefill checkpoint, decode steps with the out-of-window SWA frees, finishes,
bare matches, locks, inserts and the three evictions), run on both sides
through the calls the differential compares.  The harness (CPU time,
interleaved sides in fresh processes, medians) is ``tools/bench_hybrid.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_hybrid import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(family="swa"))
