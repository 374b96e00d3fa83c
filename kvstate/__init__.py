"""kvstate: an event-sourced, model-checked KV-cache manager for LLM serving.

Fact ``events`` change a state through rules written once
(``kvstate.rules``) that run on two backends: ``apply(state, event)``
returns a new immutable ``State`` (``kvstate.backends.persistent``), and the
``Engine`` changes a ``LiveState`` in place (``kvstate.backends.live``).
The planner holds all policy; front ends (``kvstate.sglang``,
``kvstate.vllm``, the seed-002 ``KVCacheManager``) expose engine APIs on top.
See README.md for a map of the modules.
"""

from kvstate import events
from kvstate.backends.live import LiveState
from kvstate.backends.persistent import apply, apply_all
from kvstate.config import ModelConfig, align_to_page, default_max_num_reqs
from kvstate.engine import Engine
from kvstate.errors import InvalidEvent, OutOfMemory
from kvstate.gctune import tune_gc
from kvstate.invariants import Violation, check
from kvstate.state import DETACHED, ROOT, Geometry, State, initial_state

__version__ = "0.2.0"

# Front ends that need torch load on first use, so ``import kvstate`` stays light.
_LAZY = {
    "KVCacheManager": ("kvstate.kv_manager", "KVCacheManager"),
    "ModeError": ("kvstate.kv_manager", "ModeError"),
    "ReservationExceeded": ("kvstate.kv_manager", "ReservationExceeded"),
    "TorchExecutor": ("kvstate.executor", "TorchExecutor"),
}


def __getattr__(name: str) -> object:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'kvstate' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(target[0]), target[1])
    globals()[name] = value
    return value

__all__ = [
    "DETACHED",
    "ROOT",
    "Engine",
    "Geometry",
    "InvalidEvent",
    "KVCacheManager",
    "LiveState",
    "ModeError",
    "ReservationExceeded",
    "TorchExecutor",
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
    "tune_gc",
]
