"""Retained prefixes as radix-tree nodes (seed 002, Part 3).  Pure.

A registered prefix is one tree node directly under the root.  Its pages
are the prefix pages of every layer, layer after layer
(``node.pages[l * n:(l + 1) * n]`` for ``n = ceil(prefix_tokens / P)``), and
its key is synthetic: ``(code, prefix_tokens, 0, 0, ...)`` with
``len(key) == len(pages) * P`` as the tree requires, where ``code`` is the
64-bit blake2b of the prefix hash string.  So the tree itself is the prefix
registry, with no map in the manager:

* lookup: the root's child under the key's first token (or first page);
* reuse: ``Touch`` (LRU stamp) and ``Lock`` (one lock per active holder);
* retention: when the last holder frees, the node stays, unlocked, with the
  tree as the only holder of its pages;
* eviction: ``plan_evict`` with SGLang's LRU order removes unlocked nodes
  when an allocation is short of pages.

Two different hash strings share a code with probability 2**-64; the
manager does not detect that.
"""

from __future__ import annotations

import hashlib

from kvstate.state import ROOT, Node, State


def prefix_code(prefix_hash: str) -> int:
    """Stable 64-bit code of a prefix hash string (first token of its key)."""
    digest = hashlib.blake2b(prefix_hash.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def prefix_key(prefix_hash: str, prefix_tokens: int, length: int) -> tuple[int, ...]:
    """Synthetic node key of ``length`` tokens (``length >= 1``)."""
    head = (prefix_code(prefix_hash), prefix_tokens)[:length]
    return head + (0,) * (length - len(head))


def prefix_tokens_of(node: Node) -> int:
    """Prefix length recorded in a prefix node's key."""
    return node.key[1] if len(node.key) > 1 else 1


def find_prefix(state: State, prefix_hash: str) -> int | None:
    """Node id of the retained prefix registered under ``prefix_hash``, if any.

    The root's children are indexed by the key's first token (P == 1) or
    first page, which for P > 1 includes the prefix length; so this scans
    the root's children for the code (one compare per retained prefix).
    """
    code = prefix_code(prefix_hash)
    nodes = state.nodes
    for node_id in state.root.children.values():
        if nodes[node_id].key[0] == code:
            return node_id
    return None


def layer_pages(node: Node, num_layers: int, layer: int) -> tuple[int, ...]:
    """The prefix pages of one layer, in position order."""
    per_layer = len(node.pages) // num_layers
    return node.pages[layer * per_layer:(layer + 1) * per_layer]


def prefix_node_of(state: State, anchor: str) -> int | None:
    """The prefix node an active request's anchor references (``ROOT``-free ``None`` if none)."""
    record = state.requests[anchor]
    if not record.pages:
        return None
    node_id = state.page_node.get(record.pages[0])
    return None if node_id is None or node_id == ROOT else node_id
