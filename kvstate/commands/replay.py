"""``kvstate replay [LOG]``: replay a log with invariant and fingerprint checks.

Exit codes: 0 clean; 1 an invariant violation, a refused event or a
fingerprint mismatch (the event index, the event and the check are named);
2 a malformed log (the byte offset and the reason are named) or a usage
problem.  Without LOG the bundled demo log (a copy of a log in the repo's
``replay/`` corpus) is replayed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from typing import IO, Any

from kvstate.log.demo_data import DEMO_NAME, demo_bytes
from kvstate.log.format import LogFormatError
from kvstate.log.initial import core_of, start_state
from kvstate.log.inspect import parse_request_id, show_pages, show_request, show_state, show_tree
from kvstate.log.reader import LogReader
from kvstate.log.replay import ReplayFailure, ReplayResult, replay
from kvstate.state import State
from kvstate.state_host import TieredState

SHOW_CHOICES = ("state", "tree", "req", "pages")


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
                        help="print what is there when the replay stops: state | tree | req ID | pages")
    parser.add_argument("--salvage", action="store_true",
                        help="replay the valid prefix of a damaged log and report where it stopped")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--reducer", choices=("auto", "pure", "transient"), default="auto",
                        help="auto (default): the transient fast path (mutable containers, "
                             "frozen at checkpoints and checks, same results) when checks are "
                             "thinned to every 64 events or more, else the pure reducer")
    parser.add_argument("--executor", choices=("cpu", "cuda"), default=None,
                        help="also rebuild real KV buffers on this device and verify them "
                             "(needs kvstate.executor)")
    parser.set_defaults(func=run)


def _open_source(path: str | None) -> tuple[str, IO[bytes]]:
    if path is None:
        return f"{DEMO_NAME} (bundled)", io.BytesIO(demo_bytes())
    return path, open(path, "rb")  # noqa: SIM115 - closed by the caller


def _show_args(values: list[str] | None) -> tuple[str, str | None] | None:
    if not values:
        return None
    what = values[0]
    if what not in SHOW_CHOICES:
        raise ValueError(f"--show takes one of {', '.join(SHOW_CHOICES)}, got {what!r}")
    if what == "req":
        if len(values) != 2:
            raise ValueError("--show req needs exactly one request id (e.g. --show req 3)")
        return what, values[1]
    if len(values) != 1:
        raise ValueError(f"--show {what} takes no argument")
    return what, None


def render_show(state: State, show: tuple[str, str | None]) -> str:
    what, argument = show
    if what == "state":
        return show_state(state)
    if what == "tree":
        return show_tree(state)
    if what == "pages":
        return show_pages(state)
    return show_request(state, parse_request_id(argument or ""))


class _Progress:
    """A one-line progress bar on stderr, only when stderr is a terminal."""

    def __init__(self, total_bytes: int | None) -> None:
        self.total = total_bytes
        self.enabled = sys.stderr.isatty()
        self.last = 0.0
        self.drawn = False

    def __call__(self, events: int, offset: int) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.last < 0.2:
            return
        self.last = now
        self.drawn = True
        if self.total:
            fraction = min(offset / self.total, 1.0)
            bar = "#" * int(fraction * 30)
            sys.stderr.write(f"\r[{bar:<30}] {fraction:6.1%} {events} events")
        else:
            sys.stderr.write(f"\r{events} events")
        sys.stderr.flush()

    def clear(self) -> None:
        if self.drawn:
            sys.stderr.write("\r" + " " * 60 + "\r")
            sys.stderr.flush()


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
    progress = _Progress(total)
    with handle:
        try:
            reader = LogReader(handle, salvage=args.salvage)
        except LogFormatError as exc:
            failure = ReplayFailure("format", exc.reason, None, None, None, exc.offset)
            return _report_format_only(args, name, failure)
        fast = {"auto": None, "pure": False, "transient": True}[args.reducer]
        try:
            result = replay(reader, check_every=args.check_every, until=args.until,
                            on_progress=progress if progress.enabled else None, fast=fast)
        except ValueError as exc:  # --reducer transient on a log it cannot take
            print(f"kvstate replay: {exc}", file=sys.stderr)
            return 2
    progress.clear()
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
    from kvstate.executor import replay_hook

    name, handle = _open_source(args.log)
    with handle:
        reader = LogReader(handle, salvage=True)
        events = _limited(reader.events(), args.until)
        # Integrity is verified at the invariant interval too (and always at the end), so a
        # log that ends with every request closed is still checked along the way.
        outcome = replay_hook((start_state(result.header), events), args.executor,
                              check_every=args.check_every)
    return {"ok": outcome.ok, "device": args.executor, "message": outcome.message,
            "events_applied": outcome.events_applied, "tokens_checked": outcome.tokens_checked}


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
        print(json.dumps({"log": name, "events": 0, "requests": 0, "final_fingerprint": None,
                          "ok": False, "error": failure.to_json()}))
    else:
        print(f"{name}: {failure.describe()}", file=sys.stderr)
    return 2


def _report(args: argparse.Namespace, name: str, result: ReplayResult,
            show: tuple[str, str | None] | None, executor_report: dict[str, Any] | None) -> int:
    summary = result.summary
    failure = result.failure
    if args.json:
        out: dict[str, Any] = {"log": name, "events": summary.events, "requests": summary.requests,
                               "final_fingerprint": summary.final_fingerprint, "ok": failure is None}
        out["summary"] = summary.to_json()
        out["stopped_early"] = result.stopped_early
        out["reducer"] = result.reducer
        if result.salvaged is not None:
            out["salvage"] = {"byte_offset": result.salvaged.offset, "reason": result.salvaged.reason,
                              "events": summary.events}
        if failure is not None:
            out["error"] = failure.to_json()
        if show is not None:
            out["show"] = render_show(core_of(result.state), show)
        if executor_report is not None:
            out["executor"] = executor_report
        print(json.dumps(out))
        return _exit_code(failure)
    print(_summary_text(name, result))
    if executor_report is not None and executor_report["ok"]:
        print(f"  executor        {executor_report['message']}")
    if show is not None:
        print(render_show(core_of(result.state), show))
    if result.salvaged is not None:
        print(f"salvage: stopped at byte {result.salvaged.offset}: {result.salvaged.reason}; "
              f"replayed the {summary.events} events before it")
    if failure is not None:
        print(f"FAILED: {failure.describe()}", file=sys.stderr)
    return _exit_code(failure)


def _host_text(result: ReplayResult) -> str:
    state = result.state
    if not isinstance(state, TieredState):
        return ""
    host = state.host
    used = host.num_pages - len(host.free_pages)
    return (f"; host tier {host.num_pages} pages ({used} in use, {len(host.backup)} nodes backed up, "
            f"{len(host.evicted_children)} host-only)")


def _cache_lines(result: ReplayResult) -> list[str]:
    s = result.summary
    if result.header.geometry.mode == "block":
        return [f"  prefix hits     {s.block_hits} cached blocks taken by requests, "
                f"{s.blocks_allocated} blocks allocated",
                f"  evictions       {s.blocks_uncached} cached blocks evicted (lazily, on reuse)"]
    return [f"  prefix hits     {s.prefix_hit_tokens} tokens, rate {s.prefix_hit_rate:.1%} "
            f"(of {s.prefix_hit_tokens + s.prefill_tokens} prefill tokens)",
            f"  evictions       {s.evictions} ({s.evicted_nodes} nodes, {s.evicted_tokens} tokens)"]


def _summary_text(name: str, result: ReplayResult) -> str:
    s = result.summary
    g = result.header.geometry
    types = ", ".join(f"{tag} {count}" for tag, count in sorted(s.by_type.items(), key=lambda kv: -kv[1]))
    status = "ok" if result.ok else "FAILED"
    if result.stopped_early:
        status += f" (stopped at event {s.events} by --until)"
    return "\n".join([
        f"{name}: {status}",
        f"  geometry        {g.num_pages} pages x {g.page_size} tokens, {g.num_rows} rows"
        + _host_text(result),
        f"  events          {s.events} ({types or 'none'})",
        f"  requests        {s.requests}",
        f"  peak pages used {s.peak_pages_used} of {g.num_pages}",
        *_cache_lines(result),
        f"  checks          {s.invariant_checks} invariant runs, "
        f"{s.checkpoints_verified} checkpoints verified",
        f"  fingerprint     {s.final_fingerprint}",
        f"  speed           {s.events_per_second:,.0f} events/s ({s.seconds:.3f} s, "
        f"{result.reducer} reducer)",
    ])
