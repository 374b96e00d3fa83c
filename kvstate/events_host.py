"""Host-tier events: back a tree node up to host memory, load it back, drop host copies.

``Offload(node, host_pages)`` copies a device node's pages to free host pages
(a backup: the device copy stays).  ``Load(node, pages, time)`` puts a
host-only node back into the device tree on free device ``pages``.
``HostFree(nodes)`` drops host copies (a host-only node leaves the tree).
An ``Evict`` of a backed-up node keeps it as a host-only node (the tiered
reducer's rule).  Records encode like every event: ``[tag, version, *fields]``.
"""

from __future__ import annotations

import attrs

from kvstate.events import Event, event, ints


@event("of")
@attrs.frozen
class Offload(Event):
    """Back up device ``node`` into ``host_pages`` (one host page per device page, in order)."""

    node: int = attrs.field(converter=int)
    host_pages: tuple[int, ...] = attrs.field(converter=ints)


@event("ld")
@attrs.frozen
class Load(Event):
    """Load host-only ``node`` back onto free device ``pages`` (in key order), stamped ``time``."""

    node: int = attrs.field(converter=int)
    pages: tuple[int, ...] = attrs.field(converter=ints)
    time: int = attrs.field(converter=int)


@event("hf")
@attrs.frozen
class HostFree(Event):
    """Drop the host copies of ``nodes`` in order; their host pages go back to the host free list."""

    nodes: tuple[int, ...] = attrs.field(converter=ints)
    at_head: bool = attrs.field(default=False, converter=bool)


HOST_EVENTS = (Offload, Load, HostFree)

# The rules live in kvstate.reducer.host; importing it registers them.
from kvstate.reducer import host as _host_rules  # noqa: E402,F401
