"""One-line warnings, before a run starts, that a chosen setting will be slow, with the faster choice.

Owned by the CLI (``kvstate.commands``; the underscore keeps it from being
taken for a command).  Each ``*_advice`` function is pure: it returns the
warnings for a command's settings, and ``warn`` prints each as one line on
stderr, so stdout (``--json``) is never touched.  The factors quoted come
from measurements on a 2-core machine (docs/benchmarks-*.md); they tell a
user which knob matters, not how long a run will take.
"""

from __future__ import annotations

import os
import sys

from kvstate.simulate.scan import TraceScan

# replay: mean bytes per event on disk, and rates (docs/benchmarks-log.md, CPU time on 2 cores):
# incremental checks after every event run near 20k events/s, full checks from scratch (or the
# persistent backend) near 1k events/s, checks every 1000 events near 70k events/s.
EVENT_BYTES = 46
CHECKED_EVENTS_WARN = 2_000_000
FULL_CHECKED_EVENTS_WARN = 50_000

# check: scopes that take minutes on one process (nightly runs; the planner-paged timing).
SLOW_SCOPES = {
    "core6-1m": "over a million states, minutes",
    "planner-paged": "about 3 minutes",
    "planner-deep": "a nightly scope, far longer than planner-paged",
}

# simulate: trace sizes (prompt + output tokens) past which a slow granularity is worth a word.
# Measured on the first 1000 Mooncake requests (7.1M tokens): block granularity 1 s, token
# granularity 24 s; token granularity with --eviction-unit page another 6x.
TOKEN_GRANULARITY_WARN = 2_000_000
PAGE_EVICTION_WARN = 1_000_000


def warn(command: str, message: str) -> None:
    """Print ``message`` as one warning line on stderr."""
    print(f"kvstate {command}: warning: {message}", file=sys.stderr)


def replay_advice(log_bytes: int | None, check_every: int, full: bool = False) -> list[str]:
    """Checks after every event (the default) on a log large enough for them to dominate."""
    if log_bytes is None or check_every != 1:
        return []
    events = log_bytes // EVENT_BYTES
    if full and events >= FULL_CHECKED_EVENTS_WARN:
        return [f"about {events:,} events, each followed by every invariant check run from "
                "scratch (--full-checks or --backend persistent), runs near 1k events/s; the "
                "default incremental checks are about 20x faster"]
    if events < CHECKED_EVENTS_WARN:
        return []
    return [f"about {events:,} events, each followed by the invariant checks (--check-every 1), "
            "runs near 20k events/s; --check-every 1000 is about 3x faster and still verifies "
            "every checkpoint fingerprint and the final state"]


def check_advice(scope: str, workers: int, walks: int, max_states: int | None,
                 cpus: int | None = None) -> list[str]:
    """A scope known to take minutes, searched on one process when more cores are there."""
    available = os.cpu_count() if cpus is None else cpus
    cost = SLOW_SCOPES.get(scope)
    if cost is None or workers > 1 or walks or (max_states is not None and max_states < 100_000):
        return []
    if not available or available < 2:
        return []
    suggested = min(available, 8)
    return [f"scope {scope} is {cost} on one process; --workers {suggested} searches the same "
            f"states on {suggested} processes (1.6-2x faster on 2 cores)"]


def simulate_advice(scan: TraceScan, eviction_unit: str, capacity_pages: list[int]) -> list[str]:
    """Token granularity on a hashed trace, and page eviction where it costs much or changes nothing."""
    found: list[str] = []
    hashed = scan.first is not None and scan.first.block_size > 0
    if scan.granularity == "token" and hashed and scan.tokens >= TOKEN_GRANULARITY_WARN:
        found.append(
            f"--granularity token drives {scan.tokens / 1e6:.1f}M tokens in pages of {scan.unit_tokens} "
            f"({scan.pages_per_block} per trace block), about 20x slower than --granularity block, "
            "which counts hits per trace hash block")
    if eviction_unit != "page":
        return found
    if capacity_pages and min(capacity_pages) >= scan.page_bound:
        found.append(
            f"every capacity holds the whole trace ({scan.page_bound:,} pages), so nothing is ever "
            "evicted: --eviction-unit page only splits nodes here, and --eviction-unit node gives "
            "the same result faster")
    elif scan.granularity == "token" and scan.tokens >= PAGE_EVICTION_WARN:
        found.append(
            f"--eviction-unit page splits every cached node into {scan.unit_tokens}-token pages, "
            "about 6x slower than --eviction-unit node; for a per-block trie use --granularity "
            "block --eviction-unit page")
    return found
