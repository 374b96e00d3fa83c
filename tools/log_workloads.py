"""Workloads the log benchmarks and the soak record: SGLang-style and vLLM-style runs.

``record_sglang`` drives the synthetic SGLang workload (``kvstate.workloads.synthetic``)
with a ``Recorder`` attached; ``record_vllm`` drives ``kvstate.vllm.KVCacheManager``
with requests on shared stems (admit, decode, free).  Both keep no events in memory,
so they can record millions.  Tools-layer code; owned by the log benchmarks.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvstate.log import Recorder
from kvstate.workloads.synthetic import SyntheticRun, WorkloadSpec, run_synthetic


def record_sglang(path: Path, requests: int, page_size: int, seed: int = 1,
                  on_batch: Callable[[Recorder], None] | None = None) -> int:
    """Record the synthetic SGLang workload; returns the number of events."""
    spec = WorkloadSpec(requests=requests, seed=seed, page_size=page_size,
                        capacity=1024 * page_size if page_size > 1 else 4096, max_running=16)
    holder: list[Recorder] = []

    def attach(run: SyntheticRun) -> None:
        recorder = Recorder(run.engine, path, fsync=False, flush_bytes=1 << 20)
        holder.append(recorder)
        if on_batch is not None:
            run.engine.subscribe(lambda event, view: on_batch(recorder))

    run_synthetic(spec, attach=attach, keep_events=False)
    holder[0].close()
    return holder[0].count


def record_vllm(path: Path, requests: int, block_size: int = 16, blocks: int = 512,
                seed: int = 1) -> int:
    """Record a vLLM-style run: requests on a few shared stems, decoding a few tokens each."""
    from kvstate.vllm import KVCacheManager, Request

    rng = random.Random(seed)
    manager: Any = KVCacheManager(blocks, block_size, 1 << 14, enable_kv_cache_events=True)
    manager.engine.keep_events = False
    stems = [[rng.randrange(1, 30000) for _ in range(rng.randint(32, 160))] for _ in range(6)]
    recorder = Recorder(manager, path, fsync=False, flush_bytes=1 << 20)
    running: list[Any] = []
    for index in range(requests):
        prompt = rng.choice(stems) + [rng.randrange(1, 30000) for _ in range(rng.randint(4, 48))]
        request = Request(f"r{index}", prompt, block_size)
        found, hit, _ = manager.get_computed_blocks(request)
        if manager.allocate_slots(request, request.num_tokens - hit, hit, found) is None:
            while running:
                manager.free(running.pop(0))
            continue
        request.num_computed_tokens = request.num_tokens
        for _ in range(rng.randint(1, 8)):
            request.append_output_token_ids(rng.randrange(1, 30000))
            if manager.allocate_slots(request, 1) is None:
                break
            request.num_computed_tokens = request.num_tokens
        running.append(request)
        if len(running) > 8:
            manager.free(running.pop(rng.randrange(len(running))))
    for request in running:
        manager.free(request)
    recorder.close()
    return recorder.count
