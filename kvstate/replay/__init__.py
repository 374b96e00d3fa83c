"""Tools built on logs: replay (with checks), diff, minimize.

``replay`` re-applies a log's events and checks invariants and fingerprints;
``diff_logs`` finds where two logs diverge; ``minimize_events`` /
``minimize_file`` shrink a failing log while keeping its failure.
"""

from kvstate.replay.diff import LogDiff, diff_logs
from kvstate.replay.minimize import MinimizeResult, NoFailure, minimize_events, minimize_file
from kvstate.replay.run import ReplayFailure, ReplayResult, Summary, replay, replay_path, start_state

__all__ = [
    "LogDiff",
    "MinimizeResult",
    "NoFailure",
    "ReplayFailure",
    "ReplayResult",
    "Summary",
    "diff_logs",
    "minimize_events",
    "minimize_file",
    "replay",
    "replay_path",
    "start_state",
]
