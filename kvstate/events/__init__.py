"""Fact events: one immutable msgspec struct per change to the cache state.

``base`` (the base class, field types, tag registry), ``radix`` (rows,
pages, the radix tree), ``block`` (vLLM's block pool), ``host`` (the host
tier) and ``codec`` (records ``[tag, version, *fields]``, validated while
decoded).  The event modules are imported before the codec so its union
covers every tag.
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
from kvstate.events.codec import (  # noqa: I001  (after the event modules: the union covers every tag)
    EventDecodeError,
    decode_event,
    encode_event,
    event_record,
    validated,
)
from kvstate.events.host import HOST_EVENTS, HostFree, Load, Offload
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

__all__ = [
    "BLOCK_EVENTS", "EVENT_TYPES", "HOST_EVENTS", "MAX_ID", "MAX_NAME_CHARS", "RADIX_EVENTS",
    "Allocate", "Append", "Assign", "BlockAlloc", "BlockCache", "BlockClear", "BlockHold",
    "BlockRelease", "BlockUncache", "CacheEntry", "Copy", "Event", "EventDecodeError", "Evict",
    "Free", "FreeMapped", "HostFree", "Insert", "Load", "Lock", "Offload", "ReqAlloc", "ReqFree", "RequestId",
    "Reset", "Scatter", "Share", "Split", "Touch", "Truncate", "Unlock", "decode_event",
    "encode_event", "event", "event_record", "validated",
]
