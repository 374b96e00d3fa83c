"""``Req``: the per-request fields SGLang's cache flows read and write.

A plain mutable record owned by the caller (the scheduler); the cache
updates ``req_pool_idx``, ``prefix_indices``, ``last_node``,
``cache_protected_len`` and ``lock`` in its request flows.  It holds no core
state.  The tree lock a request holds is on ``lock.node`` when ``lock`` is
set (0.5.23's ``req.lock = cache.lock(node)``), else on ``last_node`` (the
seed-000 ``inc_lock_ref(node)`` form).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvstate.sglang.inputs import int_list


class Req:
    def __init__(self, rid: Any, origin_input_ids: Sequence[int],
                 output_ids: Sequence[int] | None = None) -> None:
        self.rid = rid
        self.origin_input_ids = int_list(origin_input_ids, "origin_input_ids")
        self.output_ids = [] if output_ids is None else int_list(output_ids, "output_ids")
        self.req_pool_idx: int | None = None
        self.prefix_indices = torch.empty((0,), dtype=torch.int64)
        self.last_node: Any = None
        self.lock: Any = None
        self.cache_protected_len = 0
        self.fill_ids: list[int] = self.origin_input_ids + self.output_ids

    def init_next_round_input(self) -> None:
        """Refresh ``fill_ids`` (SGLang does this when it schedules the next forward).

        ``fill_ids`` deliberately lags a freshly sampled token: it is what the
        last forward computed KV for, which is what ``cache_unfinished_req`` caches.
        """
        self.fill_ids = self.origin_input_ids + self.output_ids

    @property
    def extend_input_len(self) -> int:
        return len(self.fill_ids) - len(self.prefix_indices)

    def __repr__(self) -> str:
        return (f"Req(rid={self.rid!r}, input={len(self.origin_input_ids)}, "
                f"output={len(self.output_ids)}, row={self.req_pool_idx})")
