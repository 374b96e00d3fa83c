"""Mamba logs for ``tools/bench_executor_replay.py`` (``--mamba``, ``--only-mamba``).

Recorded here from the SGLang front end (``HybridReqToTokenPool`` +
``UnifiedRadixCache(FULL, MAMBA)`` + ``mamba_scheduler``):

* seeded op lists of ``tools/diff_sglang_mamba.py`` (150 ops each, small pools: copy-on-match,
  chunked prefill with a checkpoint per chunk, tracked checkpoints, Mamba and FULL evictions at
  almost every step): ``mamba_diff_<config>_s<seed>_p<page>``;
* ``mamba_serving``: a decode-heavy serving run (shared system prompts, up to 8 running,
  8 to 96 decode tokens each, the extra buffer's tracked checkpoints every 32 tokens).

They replay on ``MambaTorchExecutor`` (``REPLAY_MODEL``'s attention layers plus
``REPLAY_MAMBA``'s states per slot).  ``EXTRA`` rows time the same logs without the Mamba
states (``nomamba``: the attention KV only, what the executor did before it held them).  The
FULL + SWA + MAMBA seeds replay on the Mamba executor with the SWA layers left out
(``swa_layers=False``).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from kvstate.log import Recorder

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from serving_run import serve  # noqa: E402

SEEDS = [("mamba-nobuf", 1, 1), ("mamba-nobuf", 3, 1), ("mamba-extra", 2, 1),
         ("mamba-extra", 0, 4), ("mamba-extra", 3, 4), ("swa-mamba-extra", 3, 4)]
EXTRA = {"nomamba": {"mamba_config": None}}
OPTIONS = {"swa_layers": False}  # every Mamba row: the SWA layers (if any) left out


def record_mamba_seeds(folder: Path, steps: int = 150) -> list[Path]:
    """Mamba logs of ``tools/diff_sglang_mamba.py``'s seeded op lists on kvstate's front end."""
    from diff_sglang_mamba import generate
    from mamba_ops import apply_op
    from mamba_sides import Side

    paths = []
    for config, seed, page_size in SEEDS:
        setup, ops = generate(config, seed, steps, page_size)
        side = Side("kvstate", "-", setup)
        path = folder / f"mamba_diff_{config}_s{seed}_p{page_size}.kvlog"
        recorder = Recorder(side.cache.engine, str(path), fsync=False,
                            meta={"workload": "diff_sglang_mamba"})
        for op in ops:
            apply_op(side, op)
        recorder.close()
        paths.append(path)
    return paths


def mamba_serving(path: Path, requests: int = 150, page_size: int = 4, seed: int = 1) -> Path:
    """A decode-heavy FULL + MAMBA serving run (extra buffer) recorded from the front end.

    Requests share one of 4 system prompts, up to 8 run at once, each decodes 8..96 tokens;
    the pools (200 FULL pages of 4 tokens, 40 Mamba slots) are small enough that the tree's
    states and KV are evicted.  On OOM the oldest running request finishes early.
    """
    from kvstate.sglang import mamba_scheduler
    from kvstate.sglang.allocator import PagedTokenToKVPoolAllocator
    from kvstate.sglang.mamba_pool import HybridReqToTokenPool
    from kvstate.sglang.mamba_radix_cache import MambaCacheInitParams
    from kvstate.sglang.mamba_req import MambaReq
    from kvstate.sglang.unified_radix_cache import UnifiedRadixCache

    pool = HybridReqToTokenPool(size=16, mamba_size=40, max_context_len=1024,
                                enable_mamba_extra_buffer=True)
    alloc = PagedTokenToKVPoolAllocator(200 * page_size, page_size)
    cache = UnifiedRadixCache(MambaCacheInitParams(
        req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=page_size,
        tree_components=("FULL", "MAMBA"), enable_mamba_extra_buffer=True,
        mamba_chunk_size=8, mamba_track_interval=32))
    recorder = Recorder(cache.engine, str(path), fsync=False, meta={"workload": "mamba_serving"})
    serve(cache, mamba_scheduler, MambaReq, requests, random.Random(seed))
    recorder.close()
    return path


def mamba_logs(folder: Path) -> list[Path]:
    """Every Mamba log the benchmark times."""
    return [*record_mamba_seeds(folder), mamba_serving(folder / "mamba_serving_p4.kvlog")]


__all__ = ["EXTRA", "OPTIONS", "mamba_logs", "mamba_serving", "record_mamba_seeds"]
