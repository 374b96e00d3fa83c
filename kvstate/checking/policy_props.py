"""The properties a policy can violate, checked on each answer it gives.

``kvstate.planner.policy.EvictionPolicy`` states the rules; this module is
their executable form, used by the planner-level search
(``planner_level.PlannerLevel``) on every question the planner asks the
policy.  Each function is pure: it reads a state and the policy's answer and
returns ``(property, message)`` for the first rule broken, or ``None``.

``victims_evictable``
    Every victim exists when its turn comes, is not the root, is unlocked,
    has no children left and is mapped by no request; no node twice.
``victims_enough``
    The victims cover ``num_tokens``, or they are every evictable node.
``victims_minimal``
    Without the last victim the list would not cover ``num_tokens``.
``policy_deterministic``
    Asked the same question about the same state twice in a row, the policy
    answers the same (tested by the caller, which asks twice).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstate.state import ROOT, State

Problem = tuple[str, str]


def mapped_nodes(state: State) -> set[int]:
    """Nodes whose pages a request maps without holding them (never evictable: finding F1)."""
    page_node = state.page_node
    return {page_node[page] for page in state.tree_refs.keys() if page in page_node}


def evictable_nodes(state: State) -> set[int]:
    """Every node eviction could remove, cascading: unlocked, unmapped, and so is its whole subtree."""
    mapped = mapped_nodes(state)
    nodes = state.nodes
    out: set[int] = set()

    def visit(node_id: int) -> bool:
        node = nodes[node_id]
        below = [visit(child) for child in node.children.values()]  # visit every child
        if node_id != ROOT and node.lock_ref == 0 and node_id not in mapped and all(below):
            out.add(node_id)
            return True
        return False

    visit(ROOT)
    return out


def _tokens(state: State, nodes: Sequence[int]) -> int:
    return sum(len(state.nodes[n].key) for n in nodes)


def _asked(num_tokens: int) -> str:
    return f"asked for {num_tokens} token{'' if num_tokens == 1 else 's'}"


def _not_evictable(state: State, victims: Sequence[int]) -> Problem | None:
    """The first victim that cannot be evicted when its turn comes, and why."""
    mapped = mapped_nodes(state)
    gone: set[int] = set()
    for position, node_id in enumerate(victims):
        node = state.nodes.get(node_id)
        why = None
        if node_id in gone:
            why = "was already evicted earlier in the list"
        elif node is None or node_id == ROOT:
            why = "does not exist" if node is None else "is the root"
        elif node.lock_ref > 0:
            why = f"is locked (lock_ref {node.lock_ref})"
        elif any(child not in gone for child in node.children.values()):
            left = sorted(c for c in node.children.values() if c not in gone)
            why = f"is not a leaf (children {left} are still cached)"
        elif node_id in mapped:
            why = "is mapped by a request's table"
        if why is not None:
            return ("victims_evictable",
                    f"victims {list(victims)}: node {node_id} (position {position}) {why}")
        gone.add(node_id)
    return None


def check_victims(state: State, num_tokens: int, victims: Sequence[int]) -> Problem | None:
    """The first property ``victims`` (asked for ``num_tokens``) breaks on ``state``, or ``None``."""
    problem = _not_evictable(state, victims)
    if problem is not None:
        return problem
    covered = _tokens(state, victims)
    if covered < num_tokens:
        evictable = evictable_nodes(state)
        if set(victims) != evictable:
            return ("victims_enough",
                    f"{_asked(num_tokens)}, victims {list(victims)} cover {covered} "
                    f"while nodes {sorted(evictable)} ({_tokens(state, sorted(evictable))} tokens) "
                    "were evictable")
    if victims and _tokens(state, victims[:-1]) >= num_tokens:
        return ("victims_minimal",
                f"{_asked(num_tokens)}, victims {list(victims)} cover {covered}; "
                f"{list(victims[:-1])} already cover {_tokens(state, victims[:-1])}")
    return None
