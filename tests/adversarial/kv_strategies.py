"""Hypothesis strategies for hostile KV-event wire content.

``payloads()`` draws whole payloads: arbitrary bytes, arbitrary msgpack
values, batches whose events mix valid fields with wrong types (bools or
floats for ints, bytes for token lists, lists or maps for tags), missing and
unknown keys, deep nesting beyond what ``msgpack.packb`` writes, and valid
batches cut short or with a flipped byte.  ``sequence_numbers()`` draws how
the next live sequence number relates to the last one.  Strategies only; the
example budget comes from the active profile (``tests/conftest.py``).
"""

from __future__ import annotations

import random
from typing import Any

import msgpack
from hypothesis import strategies as st

from tests.adversarial.kv_hostile import (
    PLACEHOLDER,
    hostile_payload,
    nested_array,
    pack_batch,
    valid_payload,
    with_raw,
)

SEQ_MAX = 2**64 - 1
ints64 = st.integers(-(2**63), SEQ_MAX)
scalars = st.none() | st.booleans() | ints64 | st.floats() | st.text(max_size=8) | st.binary(max_size=16)
wire_values = st.recursive(
    scalars,
    lambda children: (st.lists(children, max_size=4)
                      | st.dictionaries(st.text(max_size=6), children, max_size=4)),
    max_leaves=16,
)

_VALID_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "block_hashes": st.lists(ints64 | st.binary(min_size=8, max_size=32), max_size=3),
    "parent_block_hash": st.none() | ints64,
    "token_ids": st.lists(st.integers(0, 2**32), max_size=8),
    "block_size": st.integers(1, 64),
    "lora_id": st.none() | st.integers(0, 100),
    "medium": st.sampled_from([None, "GPU", "CPU"]),
    "lora_name": st.none() | st.text(max_size=4),
    "extra_keys": st.none() | st.lists(st.none() | st.lists(st.text(max_size=3) | ints64, max_size=2),
                                       max_size=2),
    "group_idx": st.none() | st.integers(0, 3),
}
_LAYOUTS = {
    "BlockStored": list(_VALID_FIELDS),
    "BlockRemoved": ["block_hashes", "medium", "group_idx"],
    "AllBlocksCleared": [],
}


@st.composite
def events(draw: st.DrawFn) -> Any:
    """One event in map or array form; each field valid, wrong, or left out."""
    tag = draw(st.sampled_from(sorted(_LAYOUTS)) | wire_values)
    names = _LAYOUTS.get(tag, _LAYOUTS["BlockStored"]) if isinstance(tag, str) else _LAYOUTS["BlockStored"]
    values = []
    for name in names:
        kind = draw(st.sampled_from(["valid", "valid", "wrong", "absent"]))
        if kind == "absent":
            continue
        values.append((name, draw(_VALID_FIELDS[name] if kind == "valid" else wire_values)))
    if draw(st.booleans()):
        return [tag, *(value for _, value in values)]
    event = {"type": tag, **dict(values)}
    event.update(draw(st.dictionaries(st.text(max_size=5), wire_values, max_size=2)))
    return event


def _deep(events_: list[Any], depth: int, where: str) -> bytes:
    if where == "extra_keys":
        return with_raw([{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
                          "token_ids": [1], "block_size": 1, "extra_keys": [PLACEHOLDER]}],
                        nested_array(depth))
    if where == "unknown_key":
        return with_raw([*events_, {"type": "AllBlocksCleared", "x": PLACEHOLDER}], nested_array(depth))
    return with_raw([*events_, PLACEHOLDER], nested_array(depth))


def _mutated(payload: bytes, position: int, byte: int, cut: bool) -> bytes:
    position %= max(len(payload), 1)
    if cut:
        return payload[:position]
    return payload[:position] + bytes([byte]) + payload[position + 1:]


def payloads() -> st.SearchStrategy[bytes]:
    """Hostile payloads (some of them valid)."""
    batch_of_events = st.builds(
        lambda evs, ts, rank: pack_batch(evs, ts, rank),
        st.lists(events(), max_size=4), st.floats() | ints64 | wire_values, st.none() | wire_values)
    return st.one_of(
        st.binary(max_size=512),
        st.builds(lambda value: msgpack.packb(value, use_bin_type=True), wire_values),
        batch_of_events,
        st.builds(_deep, st.lists(events(), max_size=2), st.integers(0, 3000),
                  st.sampled_from(["extra_keys", "unknown_key", "events"])),
        st.builds(_mutated,
                  st.builds(valid_payload, st.integers(0, 2**40), st.sampled_from(["map", "array"])),
                  st.integers(0, 10**6), st.integers(0, 255), st.booleans()),
        st.builds(lambda seed: hostile_payload(random.Random(seed))[1], st.integers(0, 2**32)),
    )


def sequence_steps() -> st.SearchStrategy[tuple[str, int]]:
    """How a live message is numbered relative to the last one sent:
    ``("next", 0)``, ``("delta", d)``, or ``("absolute", n)``.  Weighted toward
    the cases with distinct outcomes: in order, repeat, step back (a stray, or a
    restart once followed by its successor), small and huge gaps, 0 and 2**64-1."""
    return st.one_of(
        st.just(("next", 0)),
        st.just(("next", 0)),
        st.just(("next", 0)),
        st.tuples(st.just("delta"), st.integers(-5, 5)),
        st.tuples(st.just("delta"), st.integers(-(2**20), 2**20)),
        st.tuples(st.just("absolute"), st.sampled_from([0, 0, 1, SEQ_MAX, SEQ_MAX - 1, 2**63])),
        st.tuples(st.just("absolute"), st.integers(0, SEQ_MAX)),
    )
