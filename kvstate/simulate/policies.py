"""The policies ``kvstate simulate`` runs: the planner's, plus the name of vLLM's pool.

The planner owns policy (``kvstate.planner.policy``): the ``EvictionPolicy``
protocol, the built-in ``lru`` / ``fifo`` / ``lfu`` and ``load_policy``, the
same loader ``kvstate check --policy`` uses.  The simulator asks a policy for
victims and placement through ``plan_extend`` and shows it the events of every
plan it commits (``observe``), in order.

``vllm`` is not an ``EvictionPolicy``: vLLM's free-queue LRU has no leaf
order, so ``kvstate.simulate.vllm_driver`` runs it on the block-mode core.
"""

from __future__ import annotations

from kvstate.planner.policy import (
    BUILTIN_POLICIES,
    EvictionPolicy,
    LeafFIFO,
    LeafLFU,
    LeafLRU,
    LeafPolicy,
    PolicyError,
    load_policy,
)

VLLM_POLICY = "vllm"
"""Not a leaf order: vLLM's free-queue LRU, run by ``kvstate.simulate.vllm_driver``."""

__all__ = ["BUILTIN_POLICIES", "VLLM_POLICY", "EvictionPolicy", "LeafFIFO", "LeafLFU", "LeafLRU",
           "LeafPolicy", "PolicyError", "load_policy"]
