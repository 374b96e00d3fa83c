"""The per-request records SGLang 0.5.23's hybrid cache flows read and write.

``HybridReq`` mirrors the fields of 0.5.23's ``Req`` that ``UnifiedRadixCache``
uses, with the KV record under ``req.kv`` as 0.5.23 keeps it
(``req_pool_idx``, ``cache_protected_len``, ``kv_allocated_len``,
``kv_committed_len``, the per-component eviction cursors).  Plain mutable
records owned by the caller (the scheduler); they hold no core state: the
cache turns them into a ``kvstate.planner.swa_requests.HybridCursor`` for a
decision and writes the new cursor back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from kvstate.planner.swa_match import Receipt
from kvstate.sglang.inputs import as_int, int_list
from kvstate.state import ROOT

SWA = "SWA"  # the component name 0.5.23 keys its cursors by (ComponentType.SWA)


def component_name(component: Any) -> str:
    """``"SWA"`` for the string or for SGLang's ``ComponentType.SWA``."""
    return str(getattr(component, "name", component)).upper()


@dataclasses.dataclass
class KVRecord:
    req_pool_idx: int | None = None
    cache_protected_len: int = 0
    cache_inserted_len: int = 0
    kv_allocated_len: int = 0
    kv_committed_len: int = 0
    component_evicted_seqlens: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def holds_kv(self) -> bool:
        return self.req_pool_idx is not None

    def get_evicted_seqlen(self, component: Any) -> int:
        return self.component_evicted_seqlens.get(component_name(component), 0)

    def set_evicted_seqlen(self, component: Any, length: int) -> None:
        self.component_evicted_seqlens[component_name(component)] = length


@dataclasses.dataclass
class HybridCacheInitParams:
    """0.5.23's ``CacheInitParams`` fields a ``UnifiedRadixCache(FULL, SWA)`` reads."""

    req_to_token_pool: Any = None
    token_to_kv_pool_allocator: Any = None
    page_size: int = 1
    sliding_window_size: int | None = None
    tree_components: tuple[Any, ...] = ("FULL", SWA)
    disable: bool = False
    eviction_policy: str = "lru"


@dataclasses.dataclass
class HybridInsertParams:
    """0.5.23's ``InsertParams`` fields the SWA component reads (with its cursor accessors)."""

    key: Any = None
    value: Any = None
    prev_prefix_len: int = 0
    swa_branching_seqlen: int | None = None
    inserted_len: int = 0
    priority: int = 0
    component_evicted_seqlens: dict[str, int] = dataclasses.field(default_factory=dict)

    def get_evicted_seqlen(self, component: Any) -> int:
        return self.component_evicted_seqlens.get(component_name(component), 0)

    def set_evicted_seqlen(self, component: Any, length: int) -> None:
        self.component_evicted_seqlens[component_name(component)] = length


@dataclasses.dataclass
class HybridReceipt:
    """0.5.23's ``DecLockRefParams`` for a hybrid lock: the anchor and the SWA window's
    boundary receipt (``None``: the window reached the root)."""

    node_id: int | None = None
    component_lock_uuids: dict[str, int | None] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class HybridLock:
    """0.5.23's ``TreeLock``: what ``lock`` returns and ``unlock`` / ``release_swa`` take."""

    node: Any
    receipt: HybridReceipt
    swa_released: bool = False
    released: bool = False  # unlocked: a second unlock would drop another holder's lock

    def planned(self) -> Receipt:
        """The receipt as the planner takes it (``TypeError`` / ``ValueError`` for a node id
        or a uuid that is not an int: they go into events as they are)."""
        node_id = self.receipt.node_id
        node_id = ROOT if node_id is None else as_int(node_id, "receipt node id")
        uuid = self.receipt.component_lock_uuids.get(SWA)
        uuid = 0 if uuid is None else as_int(uuid, "SWA lock uuid")
        return Receipt(node_id, uuid, node_id != ROOT and not self.swa_released)


class HybridReq:
    """A request as the hybrid flows see it (0.5.23's names)."""

    def __init__(self, rid: Any, origin_input_ids: Sequence[int],
                 output_ids: Sequence[int] | None = None) -> None:
        self.rid = rid
        self.origin_input_ids = int_list(origin_input_ids, "origin_input_ids")
        self.output_ids = [] if output_ids is None else int_list(output_ids, "output_ids")
        self.kv = KVRecord()
        self.lock: Any = None
        self.last_node: Any = None
        self.prefix_len = 0
        self.extend_end = 0
        self.swa_branching_seqlen: int | None = None
        self.decode_batch_idx = 0
        self.finished_reason: Any = None

    @property
    def full_untruncated_fill_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    def get_fill_ids(self) -> list[int]:
        """What the last extend computed KV for (0.5.23: the fill ids up to ``extend_end``)."""
        return self.full_untruncated_fill_ids[: self.extend_end]

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def finished(self) -> bool:
        return self.finished_reason is not None

    def owned_kv_len(self) -> int:
        return self.kv.kv_committed_len

    def __repr__(self) -> str:
        return (f"HybridReq(rid={self.rid!r}, input={len(self.origin_input_ids)}, "
                f"output={len(self.output_ids)}, row={self.kv.req_pool_idx})")


__all__ = ["SWA", "HybridCacheInitParams", "HybridInsertParams", "HybridLock", "HybridReceipt",
           "HybridReq", "KVRecord", "component_name"]
