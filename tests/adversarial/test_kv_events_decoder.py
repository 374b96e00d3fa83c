"""Adversarial: the KV-event decoder over hostile payloads.

Every payload either decodes to a batch whose canonical encoding is a fixed
point, or raises ``KVEventDecodeError``; nothing else escapes.  Decoding
allocates at most ``DECODE_EXPANSION`` times the payload's size (the bound
``docs/vllm.md`` documents).  Example budgets come from the active hypothesis
profile (``ci`` in CI, ``nightly`` for long runs).
"""

from __future__ import annotations

import random
import tracemalloc

import pytest
from hypothesis import given

from kvstate.vllm.kv_events import KVEventBatch, KVEventDecodeError, decode_event_batch, encode_event_batch
from tests.adversarial.kv_hostile import PAYLOAD_KINDS, VALID_KINDS
from tests.adversarial.kv_strategies import payloads

DECODE_EXPANSION = 96
"""Most bytes allocated while decoding, per payload byte: a one-byte empty map
becomes an ~80-byte dict (measured 81 under tracemalloc), the worst case msgpack allows."""


def decode_or_none(payload: bytes) -> KVEventBatch | None:
    try:
        return decode_event_batch(payload)
    except KVEventDecodeError as error:
        assert len(str(error)) < 1000, "an error message grew with the input"
        return None


@given(payloads())
def test_hostile_payloads_decode_or_raise_the_typed_error(payload: bytes) -> None:
    batch = decode_or_none(payload)
    if batch is None:
        return
    for wire_format in ("map", "array"):
        encoded = encode_event_batch(batch, wire_format)  # type: ignore[arg-type]
        again = decode_event_batch(encoded)
        assert encode_event_batch(again, wire_format) == encoded  # type: ignore[arg-type]


@given(payloads())
def test_decoding_memory_is_proportional_to_the_payload(payload: bytes) -> None:
    tracemalloc.start()
    try:
        decode_or_none(payload)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= DECODE_EXPANSION * len(payload) + 64 * 1024


@pytest.mark.parametrize("kind", sorted(PAYLOAD_KINDS))
def test_every_hostile_kind_is_typed_and_the_valid_ones_decode(kind: str) -> None:
    rng = random.Random(kind)
    results = [decode_or_none(PAYLOAD_KINDS[kind](rng)) for _ in range(25)]
    if kind in VALID_KINDS:
        assert all(isinstance(batch, KVEventBatch) for batch in results)
    elif kind != "wrong_field":  # a drawn "wrong" value is sometimes legal there (None, [])
        assert results == [None] * len(results)


def test_the_worst_expansion_stays_within_the_bound() -> None:
    """A payload made of empty maps is the costliest per byte msgpack can express."""
    count = 200_000
    payload = b"\x93\xcb" + bytes(8) + b"\xdd" + count.to_bytes(4, "big") + b"\x80" * count + b"\xc0"
    tracemalloc.start()
    try:
        assert decode_or_none(payload) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert 40 * len(payload) < peak <= DECODE_EXPANSION * len(payload)
