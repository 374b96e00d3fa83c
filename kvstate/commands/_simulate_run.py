"""The body of ``kvstate simulate`` (``commands/simulate.py`` holds its parser and documentation).

Owned by the CLI.  Order of work, so that every answer comes as early as it
can: arguments, then one pass over the whole trace (``simulate.scan``:
malformed lines fail here, with their line), then a trace without prefix
data is named (and, unless asked for, not run), then the slow-setting
warnings, then one run per (policy, capacity), each with its progress.
Everything a user reads about units tells tokens, pages and trace blocks
apart.  ``--model`` takes its own path (``_run_models``): every argument and
every budget is checked before the first run (a bad one is one line and
exit 2), then one report per layout and budget (``kvstate.simulate.hybrid_*``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kvstate.commands._advice import simulate_advice, warn
from kvstate.commands._progress import Progress, progress_mode
from kvstate.planner.policy import PolicyError, load_policy
from kvstate.simulate.driver import simulate
from kvstate.simulate.output import write_results
from kvstate.simulate.point import SimulationError
from kvstate.simulate.policies import VLLM_POLICY
from kvstate.simulate.scan import TraceScan, scan_trace
from kvstate.simulate.settings import SimulationResult, SimulationSettings
from kvstate.traces import TraceFormatError, detect_format, read_trace
from kvstate.traces.limits import MAX_BLOCK_SIZE
from kvstate.traces.sample import sample_trace

COMMAND = "simulate"


def _usage(message: str) -> int:
    print(f"kvstate simulate: {message}", file=sys.stderr)
    return 2


def _malformed(error: TraceFormatError) -> int:
    print(f"kvstate simulate: {error}", file=sys.stderr)
    return 1


def run_simulate(args: argparse.Namespace) -> int:
    from kvstate.commands.simulate import _split_list, parse_capacity

    if args.model or args.memory:
        return _run_models(args)
    if not args.capacity:
        return _usage("give --capacity (or --model with --memory)")
    try:
        capacities = [parse_capacity(text) for text in _split_list(args.capacity)]
    except ValueError as error:
        return _usage(str(error))
    policies = _split_list(args.policy or ["lru"])
    try:
        for name in policies:
            if name != VLLM_POLICY:
                load_policy(name)
    except PolicyError as error:
        return _usage(str(error))
    if not 0.0 <= args.warmup < 1.0:
        return _usage(f"--warmup must be in [0, 1), got {args.warmup}")
    if args.page_size < 1 or (args.block_size is not None and not 1 <= args.block_size <= MAX_BLOCK_SIZE):
        return _usage(f"--page-size must be positive and --block-size in [1, {MAX_BLOCK_SIZE}]")
    if args.record and len(capacities) * len(policies) != 1:
        return _usage("--record needs exactly one capacity and one policy")
    if (args.trace is None) == (not args.sample):
        return _usage("give a TRACE file or --sample (one of them)")
    if args.sample:
        with sample_trace() as path:
            return _run_trace(args, path, "mooncake", capacities, policies)
    path = Path(args.trace)
    if not path.exists():
        return _usage(f"no such trace: {path}")
    return _run_trace(args, path, args.format, capacities, policies)


def _no_prefix_note(path: Path, trace_format: str | None) -> str:
    try:
        azure = (trace_format or detect_format(path)) == "azure"
    except TraceFormatError:
        azure = False
    why = ("the Azure 2023 traces carry only arrival times and token counts" if azure
           else "its requests carry no hash blocks")
    return (f"{path.name} has no prefix data ({why}): every prompt is private, so the hit rate "
            "is 0 at any capacity")


def _run_trace(args: argparse.Namespace, path: Path, trace_format: Any,
               capacities: list[tuple[float, bool]], policies: list[str]) -> int:
    def stream() -> Any:
        return read_trace(path, trace_format, limit=args.limit, block_size=args.block_size,
                          with_tokens=False)

    mode = progress_mode(args.progress)
    try:
        with Progress(f"reading {path.name}", total=None, unit="req", mode=mode) as bar:
            scan = scan_trace(stream(), args.granularity, args.page_size, on_request=bar.update)
    except TraceFormatError as error:
        return _malformed(error)
    runs = [(policy, amount, in_pages) for policy in policies for amount, in_pages in capacities]
    if scan.granularity == "block" and not scan.has_prefix_data:
        return _usage(f"{path.name} has no hash blocks; use --granularity token for this trace")
    if not scan.has_prefix_data:
        print(f"kvstate simulate: note: {_no_prefix_note(path, trace_format)}", file=sys.stderr)
    if not scan.has_prefix_data and args.max_running is None and not args.force:
        print(f"kvstate simulate: skipped {len(runs)} run(s): one request at a time there is "
              "nothing to measure; --max-running R replays the arrival times under batching "
              "(waits, retractions), --force runs anyway", file=sys.stderr)
        return 0
    unit = scan.unit_tokens
    tokens_of = [(policy, int(amount * unit) if in_pages else int(amount))
                 for policy, amount, in_pages in runs]
    for message in simulate_advice(scan, args.eviction_unit, [tokens // unit for _, tokens in tokens_of]):
        warn(COMMAND, message)
    results: list[SimulationResult] = []
    for policy, tokens in tokens_of:
        try:
            result = _one_run(args, scan, stream, policy, tokens, mode)
        except TraceFormatError as error:
            return _malformed(error)
        except (SimulationError, ValueError) as error:
            return _usage(str(error))
        results.append(result)
        _print_result(args, result)
    if args.out:
        for written in write_results(results, args.out):
            if not args.json:
                print(f"wrote {written}")
    return 0


def _one_run(args: argparse.Namespace, scan: TraceScan, stream: Any, policy: str, tokens: int,
             mode: Any) -> SimulationResult:
    settings = SimulationSettings(
        capacity_tokens=tokens, policy=policy, warmup=args.warmup, granularity=scan.granularity,
        page_size=args.page_size, eviction_unit=args.eviction_unit, cache_output=args.cache_output,
        decode=args.decode, max_running=args.max_running, step_ms=args.step_ms)
    with Progress(f"{policy} @ {tokens:,} tokens", total=scan.requests, unit="req", mode=mode) as bar:
        return simulate(stream(), settings, scan.requests, record=args.record, progress=bar.update,
                        page_bound=scan.page_bound)


def page_noun(result: SimulationResult) -> str:
    """What ``result`` counts pages in: trace hash blocks (block granularity) or pages."""
    return "blocks" if result.settings.granularity == "block" else "pages"


def _print_result(args: argparse.Namespace, result: SimulationResult) -> None:
    record = None
    if args.record:
        slot = result.unit_tokens if result.settings.granularity == "block" else 1
        record = {"log": args.record, "page_size": 1 if slot > 1 else result.settings.page_size,
                  "tokens_per_slot": slot}
    if args.json:
        print(json.dumps({**result.to_json(), **({"record": record} if record else {})}), flush=True)
        return
    s, noun = result.settings, page_noun(result)
    print(f"{s.policy:>6} capacity {s.capacity_tokens:>13,} tokens ({result.capacity_pages:,} {noun} "
          f"of {result.unit_tokens} tokens): hit {result.hit_rate_tokens:.4f} tokens, "
          f"{result.hit_rate_blocks:.4f} {noun}; evicted {result.evicted_pages:,} {noun}; "
          f"peak {result.peak_pages:,} {noun}; rejected {result.rejected_requests}, "
          f"retracted {result.retracted_requests}, waited {result.waited_requests}", flush=True)
    if record is not None and record["tokens_per_slot"] > 1:
        print(f"recorded {args.record}: one slot of the log is one trace block of "
              f"{record['tokens_per_slot']} tokens (tokens_per_slot in its header; kvstate "
              "replay counts tokens and labels the slots)", flush=True)
    elif record is not None:
        print(f"recorded {args.record}: pages of {record['page_size']} tokens", flush=True)


# -- --model: hybrid layouts against full attention --------------------------------------------
_NOT_WITH_MODEL = (("max_running", None, "--max-running"), ("record", None, "--record"),
                   ("out", None, "--out"), ("granularity", None, "--granularity"),
                   ("eviction_unit", "node", "--eviction-unit"), ("cache_output", False, "--cache-output"))


def _run_models(args: argparse.Namespace) -> int:
    """``--model``: parse everything, read the trace once, then one report per layout and budget."""
    from kvstate.commands.simulate import _split_list, parse_capacity, parse_memory
    from kvstate.simulate.hybrid_pools import MAX_MAMBA_RATIO, ratio
    from kvstate.simulate.hybrid_report import ModelOptions
    from kvstate.simulate.layout_parse import ALL, LayoutError, parse_model
    from kvstate.simulate.models import NAMED

    if not args.model:
        return _usage("--memory needs --model")
    if (args.capacity is None) == (args.memory is None):
        return _usage("with --model give --memory or --capacity (one of them)")
    for name, default, flag in _NOT_WITH_MODEL:
        if getattr(args, name) != default:
            return _usage(f"{flag} does not apply to --model (the runs follow SGLang's hybrid flows)")
    if any(policy != "lru" for policy in _split_list(args.policy or ["lru"])):
        return _usage("--model runs SGLang's hybrid cache, which evicts by LRU only (--policy lru)")
    try:
        layouts = [layout for value in args.model
                   for layout in (NAMED.values() if value == ALL else [parse_model(value)])]
        budgets: list[tuple[float, bool, bool]] = (
            [(parse_memory(text), False, True) for text in _split_list(args.memory)]
            if args.memory else
            [(*parse_capacity(text), False) for text in _split_list(args.capacity)])
        options = ModelOptions(ratio(args.swa_full_tokens_ratio, "--swa-full-tokens-ratio"),
                               ratio(args.mamba_full_memory_ratio, "--mamba-full-memory-ratio",
                                     high=MAX_MAMBA_RATIO),
                               decode=args.decode, warmup=args.warmup)
    except (LayoutError, ValueError) as error:
        return _usage(str(error))
    if not layouts or not budgets:
        return _usage("give at least one --model and one --memory or --capacity value")
    if not 0.0 <= args.warmup < 1.0:
        return _usage(f"--warmup must be in [0, 1), got {args.warmup}")
    if args.block_size is not None and not 1 <= args.block_size <= MAX_BLOCK_SIZE:
        return _usage(f"--block-size must be in [1, {MAX_BLOCK_SIZE}]")
    if args.limit is not None and args.limit < 1:
        return _usage(f"--limit must be at least 1, got {args.limit}")
    if (args.trace is None) == (not args.sample):
        return _usage("give a TRACE file or --sample (one of them)")
    if args.sample:
        with sample_trace() as path:
            return _model_trace(args, path, "mooncake", layouts, budgets, options)
    path = Path(args.trace)
    if not path.exists():
        return _usage(f"no such trace: {path}")
    return _model_trace(args, path, args.format, layouts, budgets, options)


def _memory_of(layout: Any, budget: tuple[float, bool, bool], block_size: int) -> int:
    """Bytes of one budget for ``layout``: ``--memory`` as given, ``--capacity`` as the memory a
    full-attention pool of that many tokens (or trace blocks) takes; ``ValueError`` past
    ``MAX_MEMORY``."""
    from kvstate.commands.simulate import MAX_MEMORY

    amount, in_pages, is_memory = budget
    if is_memory:
        return int(amount)
    tokens = amount * block_size if in_pages else amount
    if tokens * layout.fa_bytes_per_token > MAX_MEMORY:
        raise ValueError(f"--capacity {amount:.6g} {'blocks' if in_pages else 'tokens'} of "
                         f"{layout.name} KV is more than 1 EiB (2^60 bytes)")
    return int(tokens) * layout.fa_bytes_per_token


def _model_trace(args: argparse.Namespace, path: Path, trace_format: Any, layouts: list[Any],
                 budgets: list[tuple[float, bool, bool]], options: Any) -> int:
    from kvstate.simulate.hybrid_output import text_lines, to_json
    from kvstate.simulate.hybrid_report import run_model, trace_shape

    def stream() -> Any:
        return read_trace(path, trace_format, limit=args.limit, block_size=args.block_size,
                          with_tokens=False)

    mode = progress_mode(args.progress)

    def progress(label: str, total: int) -> Progress:
        return Progress(label, total=total, unit="req", mode=mode)

    try:
        with Progress(f"reading {path.name}", total=None, unit="req", mode=mode) as bar:
            shape = trace_shape(stream(), bar.update)
        jobs = [(layout, _memory_of(layout, budget, shape.block_size))
                for layout in layouts for budget in budgets]  # every budget checked before a run
    except TraceFormatError as error:
        return _malformed(error)
    except (SimulationError, ValueError) as error:
        return _usage(str(error))
    try:
        for layout, memory in jobs:
            report = run_model(layout, memory, stream, shape, options, progress)
            if args.json:
                print(json.dumps(to_json(report)), flush=True)
            else:
                print("\n".join(text_lines(report)), flush=True)
    except TraceFormatError as error:
        return _malformed(error)
    except SimulationError as error:
        return _usage(str(error))
    return 0
