"""Memory utilization of KVCacheManager's basic vs paged modes on Azure 2023 lengths.

In the spirit of the vLLM paper's Figure 2 (reference/traces.md section 3.3):
serve the first ``--requests`` requests of an Azure LLM inference 2023 trace
(prompt = ContextTokens, output = GeneratedTokens; arrival order only, no
clock; all are queued at the start) through one ``KVCacheManager`` with a
fixed byte budget, and break the budget down, averaged over the decode steps
taken while requests are still queued (the saturated phase), into

* token states: (token, layer) entries actually stored (``stats()``);
* reservation: reserved slots a running request *will* fill later;
* internal fragmentation: allocated slots that will never be filled
  (basic: ``max_gen_tokens`` beyond the true output; paged: the unfilled
  tail of each last page, ``1 - memory_efficiency()`` of what is allocated);
* free: not allocated.

Policies: ``basic-max`` reserves ``prompt + max output of the window``
(Orca Max), ``basic-pow2`` reserves the next power of two of the true
length (Orca Pow2), ``basic-oracle`` the true output (Orca Oracle), and
``paged-P`` uses ``allocate_paged`` with page size P.  Scheduling is the
same for all: FCFS admission while the allocation succeeds, one decode token
per running request per step.  Paged admission keeps 1% of the pages free
(vLLM's watermark); when a decode token finds no page, the newest running
request is preempted (freed and re-queued at the front, recomputed later).

Prefill of a prompt is committed as the events ``p`` ``append_token`` calls
would produce (``Share``/``Append`` for basic, ``Append`` for paged), without
writing values; every decode token goes through ``append_token`` /
``append_token_paged`` with real values.  The model has one layer: every
layer grows in lockstep, so the fractions do not depend on the layer count.

Usage (from the repository root; ``../shared`` holds the traces)::

    python tools/bench_kv_manager.py                       # conv, 200 requests
    python tools/bench_kv_manager.py --trace code --write  # also rewrite the docs file
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvstate import ModelConfig
from kvstate.errors import OutOfMemory
from kvstate.events import Append, Share
from kvstate.kv_manager import KVCacheManager
from kvstate.planner.kv_layout import anchor_name, layer_name

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces" / "azure_llm_inference_2023"
TRACE_FILES = {"conv": "AzureLLMInferenceTrace_conv.csv", "code": "AzureLLMInferenceTrace_code.csv"}
DOC = REPO / "docs" / "benchmarks-kv-manager.md"
CONFIG = ModelConfig(num_layers=1, num_kv_heads=1, head_dim=1)


def read_lengths(path: Path, limit: int) -> list[tuple[int, int]]:
    """``(prompt, output)`` of the first ``limit`` rows."""
    out: list[tuple[int, int]] = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            out.append((int(row["ContextTokens"]), int(row["GeneratedTokens"])))
            if len(out) == limit:
                break
    return out


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def reserve_for(policy: str, prompt: int, output: int, max_output: int) -> int:
    """``max_gen_tokens`` a basic policy asks for."""
    if policy == "basic-max":
        return max_output
    if policy == "basic-pow2":
        return next_pow2(prompt + output) - prompt
    return output


def prefill(manager: KVCacheManager, request_id: str, prompt: int) -> None:
    """Commit what ``prompt`` ``append_token`` calls commit, without the values."""
    if prompt == 0:
        return
    engine, table = manager.engine, layer_name(request_id, 0)
    if manager.mode == "basic":
        slots = list(engine.view.requests[anchor_name(request_id)].pages[:prompt])
        engine.apply(Share(table, 0, tuple(slots)))
    engine.apply(Append(((table, prompt),)))


def simulate(policy: str, lengths: list[tuple[int, int]], budget_tokens: int) -> dict[str, Any]:
    paged = policy.startswith("paged")
    page_size = int(policy.split("-")[1]) if paged else 16
    manager = KVCacheManager(CONFIG, budget_tokens * CONFIG.bytes_per_token, page_size=page_size)
    max_output = max(output for _, output in lengths)
    waiting = deque((f"r{i}", p, o) for i, (p, o) in enumerate(lengths))
    running: dict[str, list[int]] = {}  # id -> [prompt, output, reserved, generated]
    sums = {"token_states": 0.0, "reservation": 0.0, "internal_fragmentation": 0.0, "free": 0.0}
    steps = sampled = batch_total = preemptions = 0
    watermark = manager.max_pages // 100  # paged admission keeps 1% of the pages free
    started = time.perf_counter()
    while waiting or running:
        while waiting:
            request_id, prompt, output = waiting[0]
            if paged:
                free_pages = manager.max_pages - manager.stats()["used_memory_bytes"] // (
                    manager.bytes_per_page)
                admitted = (free_pages - -(-prompt // page_size) >= watermark or not running) \
                    and manager.allocate_paged(request_id, prompt)
                reserved = 0
            else:
                reserved = prompt + reserve_for(policy, prompt, output, max_output)
                admitted = manager.allocate(request_id, prompt, reserved - prompt)
            if not admitted:
                if not running:
                    raise SystemExit(f"{policy}: request {request_id} ({prompt}+{output}) "
                                     f"never fits in {budget_tokens} tokens")
                break
            waiting.popleft()
            prefill(manager, request_id, prompt)
            running[request_id] = [prompt, output, reserved, 0]
        steps += 1
        batch_total += len(running)
        for request_id in list(running):
            if request_id not in running:  # preempted earlier in this step
                continue
            prompt, output, _, generated = running[request_id]
            if generated < output:
                if not append_or_preempt(manager, request_id, generated, running, waiting):
                    preemptions += 1
                    continue
                running[request_id][3] = generated = generated + 1
            if generated >= output:
                manager.free(request_id)
                del running[request_id]
        if waiting:  # measure the saturated phase only (requests are queued)
            sampled += 1
            sample(manager, running, paged, budget_tokens, sums)
    seconds = time.perf_counter() - started
    if sampled == 0:
        raise SystemExit(f"{policy}: the budget never filled; use more requests or less memory")
    result: dict[str, Any] = {key: value / sampled for key, value in sums.items()}
    used = result["token_states"] + result["reservation"] + result["internal_fragmentation"]
    result.update(policy=policy, steps=steps, sampled_steps=sampled, mean_batch=batch_total / steps,
                  preemptions=preemptions, token_share_of_allocated=result["token_states"] / used,
                  seconds=seconds)
    return result


def append_or_preempt(manager: KVCacheManager, request_id: str, generated: int,
                      running: dict[str, list[int]], waiting: deque[tuple[str, int, int]]) -> bool:
    """Decode one token; on ``OutOfMemory`` preempt the newest request and retry.

    Victims are freed and re-queued at the front (recomputed later, vLLM's
    recompute preemption).  False when ``request_id`` itself was preempted.
    """
    while True:
        try:
            manager.append_token(request_id, 0, [float(generated)], [1.0])
            return True
        except OutOfMemory:
            victim = next(reversed(running))
            prompt, output = running.pop(victim)[:2]
            manager.free(victim)
            waiting.appendleft((victim, prompt, output))
            if victim == request_id:
                return False


def sample(manager: KVCacheManager, running: dict[str, list[int]], paged: bool,
           budget_tokens: int, sums: dict[str, float]) -> None:
    """Add this step's breakdown, as fractions of the budget, to ``sums``."""
    stats = manager.stats()
    stored = stats["total_cached_tokens"]
    allocated = stats["used_memory_bytes"] // CONFIG.bytes_per_token
    if paged:
        reservation = 0
        waste = allocated - stored
        assert abs(manager.memory_efficiency() - (stored / allocated if allocated else 0.0)) < 1e-12
    else:
        will_fill = sum(min(p + o, r) for p, o, r, _ in running.values())
        reservation = will_fill - stored
        waste = allocated - will_fill
    sums["token_states"] += stored / budget_tokens
    sums["reservation"] += reservation / budget_tokens
    sums["internal_fragmentation"] += waste / budget_tokens
    sums["free"] += (budget_tokens - allocated) / budget_tokens


def markdown(trace: str, count: int, budget: int, lengths: list[tuple[int, int]],
             results: list[dict[str, Any]]) -> Iterator[str]:
    prompts = [p for p, _ in lengths]
    outputs = [o for _, o in lengths]
    yield (f"### Azure 2023 `{trace}`: first {count} requests, budget {budget} tokens\n")
    yield (f"Prompt mean {sum(prompts) / len(prompts):.0f} (max {max(prompts)}), output mean "
           f"{sum(outputs) / len(outputs):.0f} (max {max(outputs)}).\n")
    yield ("| policy | token states | reservation | internal frag. | free | token states / "
           "allocated | mean batch | decode steps | preemptions |")
    yield "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    for r in results:
        yield (f"| {r['policy']} | {r['token_states']:.1%} | {r['reservation']:.1%} | "
               f"{r['internal_fragmentation']:.1%} | {r['free']:.1%} | "
               f"{r['token_share_of_allocated']:.1%} | {r['mean_batch']:.1f} | {r['steps']} | "
               f"{r['preemptions']} |")
    yield ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default="conv",
                        help="conv, code, or a path to an Azure 2023 CSV (default conv)")
    parser.add_argument("--requests", type=int, default=200, help="first N requests (200)")
    parser.add_argument("--budget-tokens", type=int, default=16384,
                        help="KV budget in tokens (16384)")
    parser.add_argument("--policies", nargs="+",
                        default=["basic-max", "basic-pow2", "basic-oracle", "paged-16"])
    parser.add_argument("--write", action="store_true",
                        help=f"append the table to {DOC.relative_to(REPO)}")
    args = parser.parse_args(argv)
    path = TRACES / TRACE_FILES[args.trace] if args.trace in TRACE_FILES else Path(args.trace)
    lengths = read_lengths(path, args.requests)
    results = [simulate(policy, lengths, args.budget_tokens) for policy in args.policies]
    json.dump(results, sys.stdout, indent=1)
    print()
    table = "\n".join(markdown(path.name if args.trace not in TRACE_FILES else args.trace,
                               len(lengths), args.budget_tokens, lengths, results))
    print(table)
    if args.write:
        with DOC.open("a") as handle:
            handle.write("\n" + table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
