"""SOMETIMES probes of the Mamba hybrids: behaviours a checking run must witness.

``MAMBA_SOMETIMES[name](edge) -> bool`` over one accepted step
(``specs.sometimes.Edge``: the state before, the step's events, the state
after).  A run proves little about copy-on-match unless a request resumes
from a cached state, and little about eviction unless it cascades.  Pure.

* ``copy_on_match``: a tree state was copied into a request's slot;
* ``checkpoint_fork``: a running state was copied into a fresh slot for the
  tree (an unfinished ``no_buffer`` checkpoint);
* ``ping_pong_donation``: a track slot went to the tree and a fresh one took
  its place (an unfinished ``extra_buffer`` checkpoint);
* ``cascade_eviction``: a node lost its state and left the tree in the same
  step (a leaf deleted with every component, whichever walk chose it);
* ``internal_state_evicted``: a node that keeps children lost its state and
  kept its FULL KV;
* ``existing_state_kept``: an insert ended at a node that had a state, so
  the tree kept its own (``mamba_exist``).
"""

from __future__ import annotations

from collections.abc import Callable

from kvstate import events as ev
from specs.sometimes import Edge

Probe = Callable[[Edge], bool]
MAMBA_SOMETIMES: dict[str, Probe] = {}


def _probe(name: str) -> Callable[[Probe], Probe]:
    def register(fn: Probe) -> Probe:
        MAMBA_SOMETIMES[name] = fn
        return fn

    return register


@_probe("copy_on_match")
def _copy_on_match(edge: Edge) -> bool:
    states = edge.before.mamba.slot_node
    return any(isinstance(e, ev.MambaCopy) and e.src in states for e in edge.events)


@_probe("checkpoint_fork")
def _fork(edge: Edge) -> bool:
    held = edge.after.mamba.held  # the running slot stays the request's
    return any(isinstance(e, ev.MambaCopy) and e.src in held for e in edge.events)


@_probe("ping_pong_donation")
def _donation(edge: Edge) -> bool:
    return any(isinstance(e, ev.MambaDonate) for e in edge.events)


@_probe("cascade_eviction")
def _cascade(edge: Edge) -> bool:
    dropped: set[int] = set()
    for event in edge.events:
        if isinstance(event, ev.MambaEvict):
            dropped.update(event.nodes)
        elif isinstance(event, ev.Evict) and dropped.intersection(event.nodes):
            return True
    return False


@_probe("internal_state_evicted")
def _internal(edge: Edge) -> bool:
    for event in edge.events:
        if isinstance(event, ev.MambaEvict):
            for node_id in event.nodes:
                node = edge.after.nodes.get(node_id)
                if node is not None and len(node.children) > 0:
                    return True
    return False


@_probe("existing_state_kept")
def _kept(edge: Edge) -> bool:
    # The insert's commit on a node with a state: its LRU stamp, then that node's FULL stamp
    # alone (a match's touch covers the whole path, the root included).
    events = edge.events
    return any(isinstance(first, ev.MambaTouch) and isinstance(second, ev.Touch)
               and second.nodes == (first.node,) for first, second in zip(events, events[1:], strict=False))


__all__ = ["MAMBA_SOMETIMES"]
