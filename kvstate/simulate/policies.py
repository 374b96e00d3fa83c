"""Eviction policies for ``kvstate simulate``: an ordering of evictable leaves.

A policy gives ``priority(state, node_id)``; the planner evicts unlocked
leaves smallest priority first (``kvstate.planner.evict``).  A policy may
also define ``observe(events)``, which the simulator calls with the events
of every plan it commits, in order; that is how a policy keeps history the
state does not hold (LFU's access counts).  Policies are simulator-side
objects: ``observe`` mutates the policy, never a state.

A user policy is named ``module:Class``; the class is instantiated with no
arguments and needs ``priority``; ``observe`` is optional.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol

from kvstate.events import Event, Evict, Split, Touch
from kvstate.planner.evict import fifo_priority, lru_priority
from kvstate.state import State


class EvictionPolicy(Protocol):
    def priority(self, state: State, node_id: int) -> Any: ...

    def observe(self, events: Sequence[Event]) -> None: ...


class LeafLRU:
    """SGLang's order: least recently accessed leaf first, older node on ties."""

    def priority(self, state: State, node_id: int) -> Any:
        return lru_priority(state, node_id)

    def observe(self, events: Sequence[Event]) -> None:
        return None


class LeafFIFO:
    """Oldest leaf first, by creation order (node ids are handed out in order)."""

    def priority(self, state: State, node_id: int) -> Any:
        return fifo_priority(state, node_id)

    def observe(self, events: Sequence[Event]) -> None:
        return None


class LeafLFU:
    """Fewest accesses first (a walk that touches a node counts once), then LRU.

    ``counts`` is this policy's own table: ``observe`` adds one per ``Touch``,
    gives a ``Split``'s new top node the count of the node it came from, and
    forgets evicted nodes.
    """

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}

    def priority(self, state: State, node_id: int) -> Any:
        return (self.counts.get(node_id, 0), *lru_priority(state, node_id))

    def observe(self, events: Sequence[Event]) -> None:
        counts = self.counts
        for event in events:
            if isinstance(event, Touch):
                for node_id in event.nodes:
                    counts[node_id] = counts.get(node_id, 0) + 1
            elif isinstance(event, Split):
                counts[event.new_node] = counts.get(event.node, 0)
            elif isinstance(event, Evict):
                for node_id in event.nodes:
                    counts.pop(node_id, None)


BUILTIN_POLICIES: dict[str, type[Any]] = {"lru": LeafLRU, "fifo": LeafFIFO, "lfu": LeafLFU}

VLLM_POLICY = "vllm"
"""Not a leaf order: vLLM's free-queue LRU, run by ``kvstate.simulate.vllm_driver``."""


class PolicyError(ValueError):
    """A policy name that is neither built in nor an importable ``module:Class``."""


def load_policy(name: str) -> EvictionPolicy:
    """A fresh policy object for ``name`` (each run needs its own: policies keep history)."""
    if name in BUILTIN_POLICIES:
        policy: Any = BUILTIN_POLICIES[name]()
        return policy  # type: ignore[no-any-return]
    module_name, _, class_name = name.partition(":")
    if not module_name or not class_name:
        known = ", ".join(sorted(BUILTIN_POLICIES))
        raise PolicyError(f"unknown policy {name!r}: use one of {known} or module:Class")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise PolicyError(f"policy {name!r}: cannot import {module_name!r}: {error}") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise PolicyError(f"policy {name!r}: {module_name!r} has no {class_name!r}")
    instance = cls()
    if not callable(getattr(instance, "priority", None)):
        raise PolicyError(f"policy {name!r}: the class needs a priority(state, node_id) method")
    if not callable(getattr(instance, "observe", None)):
        instance = _WithObserve(instance)
    return instance  # type: ignore[no-any-return]


class _WithObserve:
    """Wraps a user policy that has no ``observe``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def priority(self, state: State, node_id: int) -> Any:
        return self.inner.priority(state, node_id)

    def observe(self, events: Sequence[Event]) -> None:
        return None
