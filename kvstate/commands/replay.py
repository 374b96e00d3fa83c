"""``kvstate replay [LOG]``: replay a log with invariant and fingerprint checks.

Exit codes: 0 clean; 1 an invariant violation, a refused event, a
fingerprint mismatch (the event index, the event and the check are named)
or a broken digest (the checkpoint interval whose bytes were altered); 2 a
malformed log (the byte offset and the reason are named), a header beyond
the limits below, or a usage problem.  Without LOG the bundled demo log (a
copy of a log in the repo's ``replay/`` corpus) is replayed.

Prompt accounting, the same for every front end: prompt_tokens (every
token a request mapped before it computed its own KV, plus that first
computed write), prefix_hit_tokens (those whose KV was already there),
computed_prompt_tokens (the misses), prefix_hit_rate = prefix_hit_tokens /
prompt_tokens.

Progress (bytes read, events, rate, ETA) is shown on a terminal, and as a
plain line every few seconds with --progress elsewhere.  A log large enough
for --check-every 1 (the default) to take minutes gets a one-line warning
naming the faster setting.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from importlib.resources import files
from typing import IO, Any

from kvstate.commands._advice import replay_advice, warn
from kvstate.commands._progress import Progress, add_progress_option, progress_mode
from kvstate.display import parse_request_id, show_pages, show_request, show_state, show_tree
from kvstate.log.format import LogFormatError
from kvstate.log.limits import tokens_per_slot
from kvstate.log.reader import LogReader
from kvstate.replay.options import add_limit_options, limits_from, say
from kvstate.replay.run import ReplayFailure, ReplayResult, replay, start_state
from kvstate.state import State

SHOW_CHOICES = ("state", "tree", "req", "pages")
DEMO_NAME = "demo.kvlog"


def demo_bytes() -> bytes:
    """The bundled demo log (a copy of ``replay/synthetic/demo_sglang_p4.kvlog``)."""
    return files("kvstate.data").joinpath(DEMO_NAME).read_bytes()


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "replay", help="replay a log, checking invariants and fingerprints",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", nargs="?", help=f"log file (default: the bundled {DEMO_NAME})")
    parser.add_argument("--check-every", type=int, default=1, metavar="N",
                        help="run the invariant checks (and, with --executor, the integrity "
                             "check) every N events (default 1; 0 = only at the end for integrity)")
    parser.add_argument("--until", type=int, default=None, metavar="N",
                        help="stop after N events (checkpoints past N and the end are not verified)")
    parser.add_argument("--show", nargs="+", default=None, metavar="WHAT",
                        help="print views of the state where the replay stops, one or more of: "
                             "state, tree, pages, req ID (e.g. --show state pages, "
                             "--show req 1 tree)")
    parser.add_argument("--salvage", action="store_true",
                        help="replay the valid prefix of a damaged log and report where it stopped")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--backend", choices=("live", "persistent"), default="live",
                        help="live (default): the rules change mutable containers in place and "
                             "checks look only at what changed; persistent: a new frozen state "
                             "per event and checks from scratch (slow; for cross-checking)")
    parser.add_argument("--full-checks", action="store_true",
                        help="run every invariant check from scratch instead of incrementally")
    parser.add_argument("--executor", choices=("cpu", "cuda"), default=None,
                        help="also rebuild real KV buffers on this device and verify them "
                             "(needs kvstate.executor)")
    add_limit_options(parser)
    add_progress_option(parser)
    parser.set_defaults(func=run)


def _open_source(path: str | None) -> tuple[str, IO[bytes]]:
    if path is None:
        return f"{DEMO_NAME} (bundled)", io.BytesIO(demo_bytes())
    return path, open(path, "rb")  # noqa: SIM115 - closed by the caller


Show = list[tuple[str, str | None]]


def _show_args(values: list[str] | None) -> Show | None:
    """``--show`` words as (view, argument) pairs: ``req`` takes the word after it."""
    if not values:
        return None
    views: Show = []
    words = iter(values)
    for what in words:
        if what not in SHOW_CHOICES:
            raise ValueError(f"--show takes {', '.join(SHOW_CHOICES)}; got {what!r}")
        if what == "req":
            request = next(words, None)
            if request is None:
                raise ValueError("--show req needs a request id (e.g. --show req 3)")
            views.append((what, request))
        else:
            views.append((what, None))
    return views


def render_show(state: State, show: Show) -> str:
    """The views asked for, in order, separated by blank lines."""
    return "\n\n".join(_render_one(state, what, argument) for what, argument in show)


def _render_one(state: State, what: str, argument: str | None) -> str:
    if what == "state":
        return show_state(state)
    if what == "tree":
        return show_tree(state)
    if what == "pages":
        return show_pages(state)
    return show_request(state, parse_request_id(argument or ""))


def run(args: argparse.Namespace) -> int:
    try:
        show = _show_args(args.show)
    except ValueError as exc:
        print(f"kvstate replay: {exc}", file=sys.stderr)
        return 2
    if args.check_every < 0 or (args.until is not None and args.until < 0):
        print("kvstate replay: --check-every and --until must be >= 0", file=sys.stderr)
        return 2
    if args.executor is not None and not _executor_available():
        print("kvstate replay: --executor needs the kvstate.executor module, which is not "
              "installed in this kvstate", file=sys.stderr)
        return 2
    if args.executor == "cuda" and not _cuda_available():
        print("kvstate replay: --executor cuda needs a CUDA device; none is available "
              "(use --executor cpu)", file=sys.stderr)
        return 2
    try:
        name, handle = _open_source(args.log)
    except OSError as exc:
        print(f"kvstate replay: cannot open {args.log}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    total = os.path.getsize(args.log) if args.log else None
    for message in replay_advice(total, args.check_every, args.full_checks or
                                 args.backend == "persistent"):
        warn("replay", message)
    progress = Progress(f"replay {os.path.basename(name)}", total=total, unit="B", unit_scale=True,
                        mode=progress_mode(args.progress))
    with handle, progress:
        try:
            reader = LogReader(handle, salvage=args.salvage, limits=limits_from(args))
        except LogFormatError as exc:
            failure = ReplayFailure("format", exc.reason, None, None, None, exc.offset)
            return _report_format_only(args, name, failure)

        def advance(events: int, offset: int) -> None:
            progress.update(offset, f"{events:,} events")

        result = replay(reader, check_every=args.check_every, until=args.until,
                        on_progress=advance if progress.mode != "off" else None,
                        backend=args.backend, full_checks=args.full_checks)
        advance(result.summary.events, reader.offset)
    executor_report = None
    if args.executor is not None and result.ok:
        executor_report = _run_executor(args, result)
        if not executor_report["ok"]:
            result.failure = ReplayFailure("executor", executor_report["message"], check="executor")
    return _report(args, name, result, show, executor_report)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return bool(torch.cuda.is_available())


def _executor_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("kvstate.executor") is not None


def _run_executor(args: argparse.Namespace, result: ReplayResult) -> dict[str, Any]:
    """Rebuild the buffers through ``kvstate.executor.replay_hook``: ok, message, counts."""
    from kvstate.executor import replay_hook, swa_window_of

    name, handle = _open_source(args.log)
    with handle:
        reader = LogReader(handle, salvage=True, limits=limits_from(args))
        events = _limited(reader.events(), args.until)
        # Integrity is verified at the invariant interval too (and always at the end), so a
        # log that ends with every request closed is still checked along the way.  The start
        # state carries the header's pools, which pick the executor: an SWA pool (the window
        # from the meta), a Mamba pool of ``mamba_slots`` states (kvstate.executor.replay).
        outcome = replay_hook((start_state(result.header), events), args.executor,
                              check_every=args.check_every,
                              swa_window=swa_window_of(result.header.meta))
    report = {"ok": outcome.ok, "device": args.executor, "message": outcome.message,
              "events_applied": outcome.events_applied, "tokens_checked": outcome.tokens_checked}
    if result.header.mamba_slots:
        report["mamba_slots"] = result.header.mamba_slots  # state buffers rebuilt and checked
    return report


def _limited(events: Any, until: int | None) -> Any:
    for index, event in enumerate(events):
        if until is not None and index >= until:
            return
        yield event


def _exit_code(failure: ReplayFailure | None) -> int:
    if failure is None:
        return 0
    return 2 if failure.kind == "format" else 1


def _report_format_only(args: argparse.Namespace, name: str, failure: ReplayFailure) -> int:
    if args.json:
        say(json.dumps({"log": name, "events": 0, "requests": 0, "final_fingerprint": None,
                        "ok": False, "error": failure.to_json()}))
    else:
        say(f"{name}: {failure.describe()}", sys.stderr)
    return 2


def _report(args: argparse.Namespace, name: str, result: ReplayResult,
            show: Show | None, executor_report: dict[str, Any] | None) -> int:
    summary = result.summary
    failure = result.failure
    if args.json:
        out: dict[str, Any] = {"log": name, "events": summary.events, "requests": summary.requests,
                               "final_fingerprint": summary.final_fingerprint, "ok": failure is None}
        out["summary"] = summary.to_json()
        out["stopped_early"] = result.stopped_early
        out["backend"] = result.backend
        if result.salvaged is not None:
            out["salvage"] = {"byte_offset": result.salvaged.offset, "reason": result.salvaged.reason,
                              "events": summary.events}
        if failure is not None:
            out["error"] = failure.to_json()
        if show is not None:
            out["show"] = render_show(result.state, show)
        if executor_report is not None:
            out["executor"] = executor_report
        say(json.dumps(out))
        return _exit_code(failure)
    say(_summary_text(name, result))
    if executor_report is not None and executor_report["ok"]:
        say(f"  executor        {executor_report['message']}")
    if show is not None:
        say(render_show(result.state, show))
    if result.salvaged is not None:
        say(f"salvage: stopped at byte {result.salvaged.offset}: {result.salvaged.reason}; "
            f"replayed the {summary.events} events before it")
    if failure is not None:
        say(f"FAILED: {failure.describe()}", sys.stderr)
    return _exit_code(failure)


def _host_text(result: ReplayResult) -> str:
    host = result.state.host
    if host is None:
        return ""
    used = host.num_pages - len(host.free_pages)
    return (f"; host tier {host.num_pages} pages ({used} in use, {len(host.backup)} nodes backed up, "
            f"{len(host.evicted_children)} host-only)")


def _cache_lines(result: ReplayResult) -> list[str]:
    s = result.summary
    # "block of 4 tokens" -> "counted in whole blocks of 4 tokens"
    unit = "" if s.granularity == "token" else (
        "; counted in whole " + s.granularity.replace(" of ", "s of ", 1))
    lines = [f"  prompt tokens   {s.prompt_tokens} ({s.prefix_hit_tokens} prefix hits, "
             f"{s.computed_prompt_tokens} computed{unit})",
             f"  prefix hits     {s.prefix_hit_rate:.1%} of prompt tokens"]
    if result.header.geometry.mode == "block":
        return [*lines,
                f"  blocks          {s.block_hits} cached blocks taken by requests, "
                f"{s.blocks_allocated} blocks allocated",
                f"  evictions       {s.blocks_uncached} cached blocks evicted (lazily, on reuse)"]
    return [*lines, f"  evictions       {s.evictions} ({s.evicted_nodes} nodes, "
                    f"{s.evicted_tokens} tokens)"]


def _digest_text(summary: Any) -> str:
    if summary.digests == "unverified":
        return "could not be verified (a format 1 log has no digests)"
    if summary.digests == "broken":
        return "BROKEN (see the failure below)"
    return f"{summary.digests_verified} verified"


def _geometry_text(result: ReplayResult) -> str:
    g = result.header.geometry
    per_slot = tokens_per_slot(result.header.meta)
    if per_slot > 1:
        return (f"{g.num_pages} pages x {g.page_size} slots of {per_slot} tokens "
                f"({g.page_size * per_slot} tokens per page), {g.num_rows} rows")
    word = "blocks" if g.mode == "block" else "pages"
    return f"{g.num_pages} {word} x {g.page_size} tokens, {g.num_rows} rows"


def _summary_text(name: str, result: ReplayResult) -> str:
    s = result.summary
    g = result.header.geometry
    types = ", ".join(f"{tag} {count}" for tag, count in sorted(s.by_type.items(), key=lambda kv: -kv[1]))
    status = "ok" if result.ok else "FAILED"
    if result.stopped_early:
        status += f" (stopped at event {s.events} by --until)"
    return "\n".join([
        f"{name}: {status}",
        f"  geometry        {_geometry_text(result)}" + _host_text(result),
        f"  events          {s.events} ({types or 'none'})",
        f"  requests        {s.requests}",
        f"  peak pages used {s.peak_pages_used} of {g.num_pages}",
        *_cache_lines(result),
        f"  checks          {s.invariant_checks} invariant runs, "
        f"{s.checkpoints_verified} checkpoints verified",
        f"  digests         {_digest_text(s)}",
        f"  fingerprint     {s.final_fingerprint}",
        f"  speed           {s.events_per_second:,.0f} events/s ({s.seconds:.3f} s, "
        f"{result.backend} backend)",
    ])
