"""How seed-002 requests and prefixes are laid out in the core state (pure readers).

The seed-002 manager (``kvstate.kv_manager``) keeps every fact in the core;
this module is the naming scheme its planner (``kvstate.planner.kv_manager``)
and its read-only derivations share.  Nothing here emits events or holds
state.

Core requests of one seed request ``<id>``::

    req/<id>          the anchor: open exactly while the seed request is active.
                      Basic mode: it holds the reservation (one page per token).
                      Paged mode: it maps the first page of the prefix it reuses
                      (that reference tells ``free`` which prefix node to unlock).
    L<layer>/<id>     the page table of one layer; its ``committed`` length is
                      the number of tokens stored for that layer.

The prefixes ``req/`` and ``L<digits>/`` cannot be confused and the seed id
follows the first ``/`` verbatim, so the mapping is injective for any string.

A retained prefix is one radix-tree node directly under the root.  Its pages
are every layer's prefix pages, layer after layer (``node.pages[l*n:(l+1)*n]``
for ``n = ceil(prefix_tokens / P)``), and its key is synthetic:
``(code, prefix_tokens, 0, 0, ...)`` with ``len(key) == len(pages) * P`` as the
tree requires, where ``code`` is the blake2b of the prefix hash string cut
to 63 bits (token ids are int64 in the event format).  So the tree itself
is the prefix registry.  Two hash strings with the same code (probability
2**-63 per pair) would be taken for one prefix.
"""

from __future__ import annotations

import hashlib
from typing import Any

from kvstate.events import MAX_ID
from kvstate.state import ROOT

ANCHOR_PREFIX = "req/"


# -- request names ------------------------------------------------------------------
def anchor_name(request_id: str) -> str:
    """Core id of a seed request's anchor."""
    return ANCHOR_PREFIX + request_id


def layer_name(request_id: str, layer: int) -> str:
    """Core id of one layer's page table of a seed request."""
    return f"L{layer}/{request_id}"


def core_names(request_id: str, num_layers: int) -> tuple[str, ...]:
    """The anchor followed by every layer table, in layer order."""
    return (anchor_name(request_id),
            *(layer_name(request_id, layer) for layer in range(num_layers)))


def seed_id(core_id: object) -> str | None:
    """The seed id of an anchor name, or ``None`` for any other core id."""
    if isinstance(core_id, str) and core_id.startswith(ANCHOR_PREFIX):
        return core_id[len(ANCHOR_PREFIX):]
    return None


def parse_layer_name(core_id: object) -> tuple[int, str] | None:
    """``(layer, seed id)`` of a layer-table name, or ``None``."""
    if not isinstance(core_id, str) or not core_id.startswith("L"):
        return None
    head, sep, rest = core_id.partition("/")
    digits = head[1:]
    if not sep or not digits.isdigit():
        return None
    return int(digits), rest


# -- retained prefixes -------------------------------------------------------------
def prefix_code(prefix_hash: str) -> int:
    """Stable 63-bit code of a prefix hash string (the first token of its key).

    63 bits because a token id must fit an int64 (``kvstate.events.MAX_ID``).
    ``UnicodeEncodeError`` (a ``ValueError``) for a string UTF-8 cannot encode.
    """
    digest = hashlib.blake2b(prefix_hash.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & MAX_ID


def prefix_key(prefix_hash: str, prefix_tokens: int, length: int) -> tuple[int, ...]:
    """Synthetic node key of ``length`` tokens (``length >= 1``)."""
    head = (prefix_code(prefix_hash), prefix_tokens)[:length]
    return head + (0,) * (length - len(head))


def prefix_tokens_of(node: Any) -> int:
    """Prefix length recorded in a prefix node's key."""
    return int(node.key[1]) if len(node.key) > 1 else 1


def find_prefix(state: Any, prefix_hash: str) -> int | None:
    """Node id of the retained prefix registered under ``prefix_hash``, if any.

    The root's children are indexed by the key's first token (P == 1) or first
    page, which for P > 1 includes the prefix length; so this scans the root's
    children for the code (one compare per retained prefix).
    """
    code = prefix_code(prefix_hash)
    nodes = state.nodes
    for node_id in nodes[ROOT].children.values():
        if nodes[node_id].key[0] == code:
            return int(node_id)
    return None


def layer_pages(node: Any, num_layers: int, layer: int) -> tuple[int, ...]:
    """The prefix pages of one layer, in position order."""
    per_layer = len(node.pages) // num_layers
    return tuple(node.pages[layer * per_layer:(layer + 1) * per_layer])


def prefix_node_of(state: Any, anchor: str) -> int | None:
    """The prefix node an active request's anchor references (``None`` if none)."""
    record = state.requests[anchor]
    if not record.pages:
        return None
    node_id = state.page_node.get(record.pages[0])
    return None if node_id is None or node_id == ROOT else int(node_id)
