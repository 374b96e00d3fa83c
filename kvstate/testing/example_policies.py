"""Example policies: one that breaks each rule of ``EvictionPolicy``, and one that is merely poor.

Each broken policy is a plausible bug, and ``kvstate check --scope planner
--policy kvstate.testing.example_policies:NAME`` reports it under the name of
the rule it breaks, with a shortest counterexample (``tests/test_policy_check.py``
pins each one; docs/checking.md shows them):

=====================  ======================  ==========================================
policy                 rule broken             the bug
=====================  ======================  ==========================================
``IgnoresLocks``       ``victims_evictable``   takes childless nodes from ``state.nodes``,
                                               locked or not
``OldestAnywhere``     ``victims_evictable``   kvcache-simulator's FIFO on a radix tree:
                                               the oldest unlocked node, leaf or not
``StaleMemo``          ``victims_evictable``   remembers its answer per ``num_tokens``;
                                               the nodes are gone the next time
``OneLeaf``            ``victims_enough``      evicts one leaf, whatever it is asked
``FlushAll``           ``victims_minimal``     evicts every evictable node when full
``Alternating``        ``policy_deterministic``  flips its order on every call
=====================  ======================  ==========================================

``MostRecentFirst`` breaks no rule: it is safe, and ``kvstate check`` passes
it.  It caches badly, which ``kvstate check --compare lru --trace T`` shows.

Each class owns only its own fields; none changes a state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.planner.evict import eviction_order, lru_priority
from kvstate.planner.policy import LeafPolicy
from kvstate.state import ROOT, State


class IgnoresLocks(LeafPolicy):
    """LRU over every childless node, including those a running request has locked."""

    def victims(self, state: State, num_tokens: int) -> Sequence[int]:
        childless = sorted((lru_priority(state, n), n) for n, node in state.nodes.items()
                           if n != ROOT and not node.children)
        out, covered = [], 0
        for _, node_id in childless:
            if covered >= num_tokens:
                break
            out.append(node_id)
            covered += len(state.nodes[node_id].key)
        return out


class OldestAnywhere(LeafPolicy):
    """The oldest unlocked node first, wherever it sits in the tree (FIFO by node id).

    This is the rule kvcache-simulator's FIFO applies to its block trie; on a
    radix tree it names interior nodes, which cannot go while their children stay.
    """

    def victims(self, state: State, num_tokens: int) -> Sequence[int]:
        out, covered = [], 0
        for node_id in sorted(state.nodes.keys()):
            if covered >= num_tokens:
                break
            if node_id != ROOT and state.nodes[node_id].lock_ref == 0:
                out.append(node_id)
                covered += len(state.nodes[node_id].key)
        return out


class StaleMemo(LeafPolicy):
    """Remembers its answer for each ``num_tokens`` and gives it again, whatever the state."""

    def __init__(self) -> None:
        self.memo: dict[int, list[int]] = {}

    def victims(self, state: State, num_tokens: int) -> Sequence[int]:
        if num_tokens not in self.memo:
            self.memo[num_tokens] = eviction_order(state, num_tokens, lru_priority)
        return self.memo[num_tokens]


class OneLeaf(LeafPolicy):
    """Evicts the least recently used leaf, and only that one, however much is asked."""

    def victims(self, state: State, num_tokens: int) -> Sequence[int]:
        return eviction_order(state, num_tokens, lru_priority)[:1]


class FlushAll(LeafPolicy):
    """Empties the cache whenever it has to evict anything."""

    def victims(self, state: State, num_tokens: int) -> Sequence[int]:
        everything = sum(len(node.key) for node in state.nodes.values())
        return eviction_order(state, everything, lru_priority)


class Alternating(LeafPolicy):
    """Oldest node first on odd calls, newest first on even ones (a counter kept in ``victims``)."""

    def __init__(self) -> None:
        self.calls = 0

    def victims(self, state: State, num_tokens: int) -> Sequence[int]:
        self.calls += 1  # the bug: only observe may change a policy
        return super().victims(state, num_tokens)

    def priority(self, state: State, node_id: int) -> Any:
        return node_id if self.calls % 2 else -node_id


class MostRecentFirst(LeafPolicy):
    """The most recently used leaf first: safe, and the worst order for a conversation."""

    def priority(self, state: State, node_id: int) -> Any:
        last_access, node = lru_priority(state, node_id)
        return (-last_access, -node)
