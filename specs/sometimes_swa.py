"""SOMETIMES probes of the FULL + SWA hybrid: behaviours a checking run must witness.

``SWA_SOMETIMES[name](edge) -> bool`` over one accepted step
(``specs.sometimes.Edge``: the state before, the step's events, the state
after).  A run of the hybrid proves little about tombstones unless it
recovers one, and little about eviction unless an eviction cascades from
one component to the other.  Pure.

* ``tombstone_recovered``: an SWA tombstone became live again from a
  request's slots (``SwaAdopt``: its FULL slot ids changed; ``SwaRebind``:
  its locked FULL slots kept, the SWA pages moved onto them);
* ``internal_tombstone``: a node that keeps children lost its SWA KV and kept
  its FULL KV (SGLang's internal SWA eviction);
* ``cascade_eviction``: a node lost its SWA KV and then left the tree in the
  same step (a leaf deleted with every component: SWA eviction freeing FULL,
  or FULL eviction freeing SWA);
* ``locked_tombstone_recovered``: the ``SwaRebind`` case alone.
"""

from __future__ import annotations

from collections.abc import Callable

from kvstate import events as ev
from specs.sometimes import Edge

Probe = Callable[[Edge], bool]
SWA_SOMETIMES: dict[str, Probe] = {}


def _probe(name: str) -> Callable[[Probe], Probe]:
    def register(fn: Probe) -> Probe:
        SWA_SOMETIMES[name] = fn
        return fn

    return register


@_probe("tombstone_recovered")
def _recovered(edge: Edge) -> bool:
    return any(isinstance(e, (ev.SwaAdopt, ev.SwaRebind)) for e in edge.events)


@_probe("locked_tombstone_recovered")
def _locked_recovered(edge: Edge) -> bool:
    return any(isinstance(e, ev.SwaRebind) for e in edge.events)


@_probe("internal_tombstone")
def _internal(edge: Edge) -> bool:
    for event in edge.events:
        if isinstance(event, ev.SwaEvict):
            for node_id in event.nodes:
                node = edge.after.nodes.get(node_id)
                if node is not None and len(node.children) > 0:
                    return True
    return False


@_probe("cascade_eviction")
def _cascade(edge: Edge) -> bool:
    tombstoned: set[int] = set()
    for event in edge.events:
        if isinstance(event, ev.SwaEvict):
            tombstoned.update(event.nodes)
        elif isinstance(event, ev.Evict) and tombstoned.intersection(event.nodes):
            return True
    return False


__all__ = ["SWA_SOMETIMES"]
