"""SWA logs for ``tools/bench_executor_replay.py`` (``--swa``, ``--only-swa``).

Recorded here from the SGLang front end (``SWATokenToKVPoolAllocator`` +
``UnifiedRadixCache`` + ``hybrid_scheduler``): the seeded op lists of
``tools/diff_sglang_hybrid.py`` (small pools: evictions, tombstones, recoveries at almost every
step) and ``swa_serving``, a decode-heavy serving run.  ``SWA_EXTRA`` rows time each log's
incremental mode with the window unknown (``nowindow``) and on the single-pool executor that
mirrors the FULL pool only (``fullpool``).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from kvstate.executor.replay import SWA_WINDOW_META
from kvstate.log import Recorder

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from serving_run import serve  # noqa: E402

SWA_EXTRA = {"nowindow": {"swa_window": None}, "fullpool": {"swa_layers": False}}
SWA_SEEDS = [(1, 1), (3, 1), (6, 1), (0, 4), (3, 4), (7, 4)]  # (seed, page size), 150 steps


def record_swa_seeds(folder: Path, steps: int = 150) -> list[Path]:
    """SWA logs of ``tools/diff_sglang_hybrid.py``'s seeded op lists on kvstate's front end."""
    from diff_sglang_hybrid import generate
    from hybrid_ops import apply_op
    from hybrid_sides import Side

    paths = []
    for seed, page_size in SWA_SEEDS:
        window, interval, ops = generate(seed, steps, page_size)
        side = Side("kvstate", "-", page_size, window)
        path = folder / f"swa_diff_s{seed}_p{page_size}.kvlog"
        recorder = Recorder(side.cache.engine, str(path), fsync=False,
                            meta={SWA_WINDOW_META: window, "workload": "diff_sglang_hybrid"})
        for op in ops:
            apply_op(side, op, interval)
        recorder.close()
        paths.append(path)
    return paths


def swa_serving(path: Path, requests: int = 150, page_size: int = 4, window: int = 32,
                seed: int = 1) -> Path:
    """A decode-heavy FULL + SWA serving run recorded from the SGLang front end.

    Requests share one of 4 system prompts, up to 8 run at once, each decodes
    8..96 tokens; out-of-window SWA is freed every 16 tokens; the pools (160
    FULL, 96 SWA pages) are small enough that the tree is evicted.  On OOM the
    oldest running request finishes early.
    """
    from kvstate.sglang import hybrid_scheduler
    from kvstate.sglang.hybrid_req import HybridCacheInitParams, HybridReq
    from kvstate.sglang.pool import ReqToTokenPool
    from kvstate.sglang.swa_allocator import SWATokenToKVPoolAllocator
    from kvstate.sglang.unified_radix_cache import UnifiedRadixCache

    pool = ReqToTokenPool(16, 1024)
    alloc = SWATokenToKVPoolAllocator(160 * page_size, 96 * page_size, page_size)
    cache = UnifiedRadixCache(HybridCacheInitParams(pool, alloc, page_size, window))
    recorder = Recorder(cache.engine, str(path), fsync=False,
                        meta={SWA_WINDOW_META: window, "workload": "swa_serving"})
    serve(cache, hybrid_scheduler, HybridReq, requests, random.Random(seed), interval=16)
    recorder.close()
    return path


__all__ = ["SWA_EXTRA", "SWA_SEEDS", "record_swa_seeds", "swa_serving"]
