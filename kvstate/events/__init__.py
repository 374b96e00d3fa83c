"""Fact events: one immutable msgspec struct per change to the cache state.

``base`` (the base class, field types, tag registry), ``radix`` (rows,
pages, the radix tree), ``block`` (vLLM's block pool), ``host`` (the host
tier), ``swa`` (the SWA pool of a FULL + SWA hybrid), ``mamba`` (the Mamba
state pool of a FULL + MAMBA hybrid) and ``codec`` (records
``[tag, version, *fields]``, validated while decoded).  The codec covers
every registered tag whatever the import order: it rebuilds when it meets a
type registered after it was built.
"""

from kvstate.events.base import EVENT_TYPES, MAX_ID, MAX_NAME_CHARS, Event, RequestId, event
from kvstate.events.block import (
    BLOCK_EVENTS,
    BlockAlloc,
    BlockCache,
    BlockClear,
    BlockHold,
    BlockRelease,
    BlockUncache,
    CacheEntry,
)
from kvstate.events.codec import (
    EventDecodeError,
    decode_event,
    encode_event,
    event_record,
    validated,
)
from kvstate.events.host import HOST_EVENTS, HostFree, Load, Offload
from kvstate.events.mamba import (
    MAMBA_EVENTS,
    MambaAlloc,
    MambaBind,
    MambaCommit,
    MambaCopy,
    MambaDonate,
    MambaEvict,
    MambaFree,
    MambaLock,
    MambaTouch,
    MambaUnlock,
)
from kvstate.events.radix import (
    RADIX_EVENTS,
    Allocate,
    Append,
    Assign,
    Copy,
    Evict,
    Free,
    FreeMapped,
    Insert,
    Lock,
    ReqAlloc,
    ReqFree,
    Reset,
    Scatter,
    Share,
    Split,
    Touch,
    Truncate,
    Unlock,
)
from kvstate.events.swa import (
    SWA_EVENTS,
    SwaAdopt,
    SwaAlloc,
    SwaEvict,
    SwaFree,
    SwaLock,
    SwaPublish,
    SwaRebind,
    SwaTouch,
    SwaUnlock,
)

__all__ = [
    "BLOCK_EVENTS", "EVENT_TYPES", "HOST_EVENTS", "MAX_ID", "MAX_NAME_CHARS", "RADIX_EVENTS",
    "Allocate", "Append", "Assign", "BlockAlloc", "BlockCache", "BlockClear", "BlockHold",
    "BlockRelease", "BlockUncache", "CacheEntry", "Copy", "Event", "EventDecodeError", "Evict",
    "Free", "FreeMapped", "HostFree", "Insert", "Load", "Lock", "MAMBA_EVENTS", "MambaAlloc",
    "MambaBind", "MambaCommit", "MambaCopy", "MambaDonate", "MambaEvict", "MambaFree",
    "MambaLock", "MambaTouch", "MambaUnlock", "Offload", "ReqAlloc", "ReqFree", "RequestId",
    "Reset", "SWA_EVENTS", "Scatter", "Share", "Split", "SwaAdopt", "SwaAlloc", "SwaEvict",
    "SwaFree", "SwaLock", "SwaPublish", "SwaRebind", "SwaTouch", "SwaUnlock", "Touch",
    "Truncate", "Unlock", "decode_event",
    "encode_event", "event", "event_record", "validated",
]
