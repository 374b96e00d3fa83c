"""The one policy ``kvstate simulate`` runs that is not an ``EvictionPolicy``: vLLM's pool.

Every leaf-order policy (``lru``, ``fifo``, ``lfu``, a user's ``module:Class``)
comes from the planner (``kvstate.planner.policy``), through the same
``load_policy`` that ``kvstate check --policy`` uses.  ``vllm`` has no leaf
order: vLLM's free-queue LRU runs on the block-mode core
(``kvstate.simulate.vllm_driver``).
"""

from __future__ import annotations

VLLM_POLICY = "vllm"

__all__ = ["VLLM_POLICY"]
