"""The request records of SGLang 0.5.23's Mamba hybrid flows (``HybridReq`` plus the Mamba fields).

``MambaKVRecord`` adds to ``KVRecord`` the fields 0.5.23 keeps on
``req.kv`` for a Mamba tree, with its names: the running state slot
``mamba_pool_idx``, the ping-pong track buffer and its indices, the tracked
checkpoint lengths, and the copy-on-match source.  Slot ids are ints (0.5.23
keeps 0-d tensors).  Plain mutable records owned by the caller (the
scheduler); the cache reads them into a ``kvstate.planner.mamba_requests.
MambaCursor`` for a decision and writes the result back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kvstate.sglang.hybrid_req import HybridReq, KVRecord

MAMBA = "MAMBA"  # the component name 0.5.23 uses (ComponentType.MAMBA)


@dataclasses.dataclass
class MambaKVRecord(KVRecord):
    mamba_pool_idx: int | None = None
    mamba_ping_pong_track_buffer: list[int] | None = None
    mamba_ping_pong_empty: list[bool] | None = None
    mamba_next_track_idx: int | None = None
    mamba_last_track_idx: int | None = None
    mamba_last_track_seqlen: int | None = None
    mamba_prev_track_seqlen: int | None = None
    mamba_cow_src_index: int | None = None

    @property
    def holds_mamba(self) -> bool:
        return self.mamba_pool_idx is not None


class MambaReq(HybridReq):
    """A request as the Mamba hybrid flows see it (0.5.23's names)."""

    def __init__(self, rid: object, origin_input_ids: Sequence[int],
                 output_ids: Sequence[int] | None = None) -> None:
        super().__init__(rid, origin_input_ids, output_ids)
        self.kv: MambaKVRecord = MambaKVRecord()
        self.mamba_branching_seqlen: int | None = None

    def __repr__(self) -> str:
        return (f"MambaReq(rid={self.rid!r}, input={len(self.origin_input_ids)}, "
                f"output={len(self.output_ids)}, row={self.kv.req_pool_idx}, "
                f"mamba={self.kv.mamba_pool_idx})")


__all__ = ["MAMBA", "MambaKVRecord", "MambaReq"]
