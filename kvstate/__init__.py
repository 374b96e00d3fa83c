"""kvstate: an event-sourced, model-checked KV-cache manager for LLM serving.

The core is an immutable ``State``, fact ``events`` and a pure reducer
``apply``; the planner holds all policy; front ends (``kvstate.sglang``)
expose engine APIs on top.  See README.md for a map of the modules.
"""

from kvstate import events
from kvstate.config import ModelConfig, align_to_page, default_max_num_reqs
from kvstate.engine import Engine
from kvstate.errors import InvalidEvent, OutOfMemory
from kvstate.invariants import Violation, check
from kvstate.reducer import apply, apply_all
from kvstate.state import DETACHED, ROOT, Geometry, State, initial_state

__version__ = "0.1.0"

__all__ = [
    "DETACHED",
    "ROOT",
    "Engine",
    "Geometry",
    "InvalidEvent",
    "ModelConfig",
    "OutOfMemory",
    "State",
    "Violation",
    "__version__",
    "align_to_page",
    "apply",
    "apply_all",
    "check",
    "default_max_num_reqs",
    "events",
    "initial_state",
]
