"""The torch executor: real KV buffers that mirror every event.

``TorchExecutor`` (MHA) and ``MLATorchExecutor`` own the buffers and follow
an ``Engine`` as a listener (``attach``); the pure ``plan`` modules turn
``(state_before, event)`` into index lists; ``exports`` reads buffers and
states in kernel layouts; ``integrity`` writes per-token tags and verifies
them (fully, or incrementally since the last check); ``host`` is the pinned
host pool.  This package imports torch; the pure core never imports it.

``SwaTorchExecutor`` holds a FULL + SWA hybrid model (``SwaModelConfig``:
which layers attend fully, which through a sliding window): the full layers
in its own buffers, the SWA layers in ``swa_pool``, written through
``full_to_swa_index_mapping``; the SWA events (:mod:`kvstate.executor.plan_swa`)
re-pair, free and poison SWA pages, and integrity mode checks every
request's last window (:mod:`kvstate.executor.integrity_swa`).

``MambaTorchExecutor`` (and ``SwaMambaTorchExecutor``, over the SWA one) holds a
FULL + MAMBA hybrid: the attention layers in its own buffers, every Mamba
layer's conv and SSM state per Mamba slot in ``mamba_pool``
(``MambaStateConfig``: layers, shapes, dtypes; SGLang's ``MambaPool`` layout,
slot 0 the dummy); the Mamba events (:mod:`kvstate.executor.plan_mamba`) copy
and poison states and hand them between rows and tree nodes, and integrity
mode tags each state by (writer, position) and checks every read and owner
(:mod:`kvstate.executor.integrity_mamba`; ``write_state`` is the forward
pass's state write).  ``sglang_mamba_indices`` and
``sglang_mamba_track_indices`` are a batch's state indices;
``vllm_group_block_tables`` the per-group block tables of vLLM's hybrid
coordinator.

``replay_hook`` (:mod:`kvstate.executor.replay`) is what ``kvstate replay
--executor cpu|cuda`` calls: it rebuilds buffers while replaying a log with
integrity mode on, for radix-mode (SGLang), block-mode (vLLM front end),
host-tier, SWA-hybrid and Mamba-hybrid logs alike.
"""

from __future__ import annotations

from kvstate.executor.buffers import TorchExecutor, default_device
from kvstate.executor.exports import (
    SwaKVLost,
    UseAfterFree,
    flashinfer_page_table,
    gather_kv,
    sglang_req_to_token,
    sglang_swa_req_to_token,
    swa_slots,
    swa_window_indices,
    vllm_block_table,
    vllm_slot_mapping,
)
from kvstate.executor.exports_groups import vllm_group_block_tables, vllm_group_slot_mappings
from kvstate.executor.exports_mamba import (
    MambaStateLost,
    gather_mamba_states,
    sglang_mamba_indices,
    sglang_mamba_track_indices,
)
from kvstate.executor.host import HostPool
from kvstate.executor.index_plan import IndexPlan
from kvstate.executor.integrity import IntegrityMonitor, IntegrityReport, enable_integrity
from kvstate.executor.mamba_config import MambaStateConfig
from kvstate.executor.mamba_executor import MambaTorchExecutor, SwaMambaTorchExecutor
from kvstate.executor.mamba_states import MambaStatePool
from kvstate.executor.mla import MLAConfig, MLATorchExecutor
from kvstate.executor.plan import plan_indices
from kvstate.executor.replay import (
    REPLAY_MAMBA,
    REPLAY_MODEL,
    ExecutorReplay,
    replay_hook,
    swa_window_of,
)
from kvstate.executor.swa_config import SwaModelConfig
from kvstate.executor.swa_executor import SwaTorchExecutor
from kvstate.executor.swa_pool import SwaKVPool

__all__ = [
    "REPLAY_MAMBA",
    "REPLAY_MODEL",
    "HostPool",
    "IndexPlan",
    "IntegrityMonitor",
    "IntegrityReport",
    "MLAConfig",
    "MLATorchExecutor",
    "MambaStateConfig",
    "MambaStateLost",
    "MambaStatePool",
    "MambaTorchExecutor",
    "ExecutorReplay",
    "SwaKVLost",
    "SwaKVPool",
    "SwaMambaTorchExecutor",
    "SwaModelConfig",
    "SwaTorchExecutor",
    "TorchExecutor",
    "UseAfterFree",
    "default_device",
    "enable_integrity",
    "flashinfer_page_table",
    "gather_kv",
    "gather_mamba_states",
    "plan_indices",
    "replay_hook",
    "sglang_mamba_indices",
    "sglang_mamba_track_indices",
    "sglang_req_to_token",
    "sglang_swa_req_to_token",
    "swa_slots",
    "swa_window_indices",
    "swa_window_of",
    "vllm_block_table",
    "vllm_group_block_tables",
    "vllm_group_slot_mappings",
    "vllm_slot_mapping",
]
