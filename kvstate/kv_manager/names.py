"""Core request names for the seed-002 manager (pure; owns no state).

The manager keeps every fact in the core; the only thing it adds is a
naming scheme that turns a seed request id into core request ids::

    req/<id>          the anchor: exists exactly while the seed request is active.
                      Basic mode: it holds the reservation (one page per token).
                      Paged mode: it maps the first page of the prefix it reuses
                      (that reference tells ``free`` which prefix node to unlock).
    L<layer>/<id>     the page table of one layer of that request; its ``committed``
                      length is the number of tokens stored for that layer.

The prefixes ``req/`` and ``L<digits>/`` cannot be confused, and the seed id
follows the first ``/`` verbatim, so the mapping is injective for any string
id (ids may themselves contain ``/``).
"""

from __future__ import annotations

ANCHOR_PREFIX = "req/"


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
