"""Host-tier events: back a tree node up to host memory, load it back, drop host copies.

``Offload(node, host_pages)`` copies a device node's pages to free host pages
(a backup: the device copy stays).  ``Load(node, pages, time)`` puts a
host-only node back into the device tree on free device ``pages``.
``HostFree(nodes)`` drops host copies (a host-only node leaves the tree).
An ``Evict`` of a backed-up node keeps it as a host-only node.  They apply
only to a state with a host tier (``initial_state(geometry, host_pages=N)``);
the rules live in ``kvstate.rules.host``.
"""

from __future__ import annotations

from kvstate.events.base import Event, Id, event


@event
class Offload(Event, tag="of", frozen=True):
    """Back up device ``node`` into ``host_pages`` (one host page per device page, in order)."""

    node: Id
    host_pages: tuple[Id, ...]


@event
class Load(Event, tag="ld", frozen=True):
    """Load host-only ``node`` back onto free device ``pages`` (in key order), stamped ``time``."""

    node: Id
    pages: tuple[Id, ...]
    time: Id


@event
class HostFree(Event, tag="hf", frozen=True):
    """Drop the host copies of ``nodes`` in order; their host pages go back to the host free list."""

    nodes: tuple[Id, ...]
    at_head: bool = False


HOST_EVENTS = (Offload, Load, HostFree)
