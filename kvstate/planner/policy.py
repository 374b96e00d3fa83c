"""The eviction-policy protocol, the built-in policies and the one loader.

The planner owns policy.  ``EvictionPolicy`` is the only shape a policy has,
whether ``kvstate check --policy`` explores it, ``kvstate simulate --policy``
runs it on a trace, or a front end passes it to ``plan_extend`` /
``plan_decode``.  ``LeafPolicy`` is the base almost every policy wants: it
turns a ``priority(state, node_id)`` into victims with the planner's own leaf
order (``evict.eviction_order``), which meets every rule of the protocol by
construction.  ``load_policy`` turns a name (``lru``, ``fifo``, ``lfu`` or
``module:Class``) into a fresh policy object for both commands.

Policies are the only mutable objects here: ``observe`` may update a
policy's own history.  Nothing in this module changes a ``State``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from kvstate.events import Event, Evict, Split, Touch
from kvstate.planner.evict import eviction_order, fifo_priority, lru_priority
from kvstate.state import State


@runtime_checkable
class EvictionPolicy(Protocol):
    """What a policy decides, and what it must not do.

    A policy decides exactly two things, and is told one:

    ``victims(state, num_tokens)``
        Which cached tree nodes to evict, in order, when the planner needs
        ``num_tokens`` more tokens of room (a whole number of pages).  The
        planner records the answer as one ``Evict`` event.
    ``at_head(state)``
        Where the pages that eviction and release free go: the head of the
        free list (reused first; SGLang's paged allocator) or the tail
        (SGLang's token allocator).
    ``observe(events)``
        Told the events of every plan the caller commits, in order, so the
        policy can keep history the state does not hold (LFU's counts).  It
        returns nothing and is the only method that may change the policy.

    It must (``kvstate check --policy`` tests each rule and reports a
    violation under the name given here):

    * ``victims_evictable``: name only nodes that exist when their turn comes
      and are evictable then: not the root, unlocked (``lock_ref == 0``), no
      children left (children named earlier in the list are gone by then),
      and no request maps their pages (``state.tree_refs``).  Each node once.
    * ``victims_enough``: cover ``num_tokens`` (the sum of the victims'
      ``len(key)``) whenever the evictable nodes, cascading to parents that
      lose their last child, can.  If they cannot, name all of them.
    * ``victims_minimal``: stop as soon as ``num_tokens`` are covered: the
      list without its last node covers fewer than ``num_tokens``.  Nodes go
      whole, so the last one may overshoot; no other node may be extra.
    * ``policy_deterministic``: give the same answer when asked the same
      question about the same state twice in a row (``victims`` and
      ``at_head`` do not change the policy).

    It must not change the state or emit events (states are immutable; the
    planner turns victims into events), and must not read anything but its
    arguments and what ``observe`` showed it: no clock, no randomness, no
    global, so a recorded run replays and a checked policy is the one that runs.
    """

    def victims(self, state: State, num_tokens: int) -> Sequence[int]: ...

    def at_head(self, state: State) -> bool: ...

    def observe(self, events: Sequence[Event]) -> None: ...


class LeafPolicy:
    """Evict unlocked leaves, smallest ``priority`` first; subclass and override ``priority``.

    The default priority is SGLang's LRU.  ``victims`` is the planner's leaf
    order (parents join once their last child goes; stop once covered), so a
    subclass that only changes ``priority`` meets the protocol as long as its
    priority is a function of the state and the policy's observed history.
    """

    def priority(self, state: State, node_id: int) -> Any:
        return lru_priority(state, node_id)

    def victims(self, state: State, num_tokens: int) -> Sequence[int]:
        return eviction_order(state, num_tokens, self.priority)

    def at_head(self, state: State) -> bool:
        return state.geometry.page_size > 1  # SGLang: the paged allocator frees at the head

    def observe(self, events: Sequence[Event]) -> None:
        return None


class LeafLRU(LeafPolicy):
    """SGLang's order: least recently accessed leaf first, older node on ties."""


class LeafFIFO(LeafPolicy):
    """Oldest leaf first, by node creation order (node ids are handed out in order).

    Leaf-only, so it is *not* kvcache-simulator's FIFO, which evicts the
    oldest block anywhere in its trie (docs/results.md gives the numbers).
    """

    def priority(self, state: State, node_id: int) -> Any:
        return fifo_priority(state, node_id)


class LeafLFU(LeafPolicy):
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


BUILTIN_POLICIES: dict[str, type[LeafPolicy]] = {"lru": LeafLRU, "fifo": LeafFIFO, "lfu": LeafLFU}

_METHODS = ("victims(state, num_tokens)", "at_head(state)", "observe(events)")


class PolicyError(ValueError):
    """A policy name that cannot be loaded; the message is one line for the user."""


def _import(module_name: str) -> Any:
    """Import ``module_name`` with the current directory on the path, as ``python -m`` would.

    "" on ``sys.path`` means the current directory; it is removed again so a
    later import elsewhere does not pick up the caller's working files.
    """
    added = "" not in sys.path
    if added:
        sys.path.insert(0, "")
    importlib.invalidate_caches()  # a policy file written a moment ago must be seen
    try:
        return importlib.import_module(module_name)
    finally:
        if added:
            sys.path.remove("")


def load_policy(name: str) -> EvictionPolicy:
    """A fresh policy for ``name``: ``lru``, ``fifo``, ``lfu``, or ``module:Class`` built with no arguments.

    Every run needs its own object (policies keep history).  Raises
    ``PolicyError`` with a one-line message when the name is unknown, the
    module cannot be imported, the class is missing or cannot be built, or
    the object lacks a method of ``EvictionPolicy``.
    """
    if name in BUILTIN_POLICIES:
        return BUILTIN_POLICIES[name]()
    module_name, _, class_name = name.partition(":")
    if not module_name or not class_name:
        known = ", ".join(sorted(BUILTIN_POLICIES))
        raise PolicyError(f"unknown policy {name!r}: use one of {known} or module:Class")
    try:
        module = _import(module_name)
    except ImportError as error:
        raise PolicyError(f"policy {name!r}: cannot import {module_name!r}: {error}") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise PolicyError(f"policy {name!r}: {module_name!r} has no {class_name!r}")
    try:
        instance = cls()
    except Exception as error:  # a user's constructor: any failure becomes the one-line message
        raise PolicyError(f"policy {name!r}: {class_name}() failed: {type(error).__name__}: "
                          f"{error}") from None
    return require_policy(instance, f"policy {name!r}")


def require_policy(candidate: Any, label: str = "policy") -> EvictionPolicy:
    """``candidate`` itself if it has every method of ``EvictionPolicy``; else ``PolicyError``.

    Both commands and ``check_policy`` call this before running anything, so a
    class without the protocol fails in one line, not with an ``AttributeError``
    deep inside a search or a simulation.
    """
    missing = [m for m in _METHODS if not callable(getattr(candidate, m.partition("(")[0], None))]
    if missing:
        raise PolicyError(
            f"{label}: {type(candidate).__name__} lacks {', '.join(missing)}; subclass "
            "kvstate.planner.policy.LeafPolicy (override priority) or define all three")
    return candidate  # type: ignore[no-any-return]
