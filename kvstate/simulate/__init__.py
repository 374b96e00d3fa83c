"""Trace-driven cache simulation through the real planner and reducer.

``simulate(requests, settings, request_count)`` runs one capacity point and
returns a ``SimulationResult`` (hit rates, evictions, peak pages, rejected
and retracted requests, and the measurement definition); ``write_results``
writes the CSV, JSON and PNG files of a sweep.  ``kvstate simulate`` is the
command-line front (``kvstate.commands.simulate``).  ``policy="vllm"`` runs
vLLM's free-queue LRU through the block-mode core instead of the radix
planner (``kvstate.simulate.vllm_driver``, imported on first use).
"""

from kvstate.simulate.driver import TraceSimulator, block_units, simulate
from kvstate.simulate.point import SimulationError
from kvstate.simulate.policies import VLLM_POLICY
from kvstate.simulate.settings import SimulationResult, SimulationSettings

__all__ = [
    "SimulationError",
    "SimulationResult",
    "SimulationSettings",
    "TraceSimulator",
    "VLLM_POLICY",
    "block_units",
    "simulate",
]
