"""Hostile KV-event wire content from a seeded ``random.Random``.

Shared by the adversarial tests (bounded-memory runs) and
``tools/soak_subscriber.py``.  :data:`PAYLOAD_KINDS` maps a name to a builder
of one payload; :func:`hostile_payload` picks one.  Some kinds are *valid*
(unknown keys, extreme but legal integers): a decoder must accept them, which
keeps "reject everything" from passing as robustness.  Pure functions of the
generator state; nothing here owns a socket.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import msgpack

from kvstate.vllm.kv_events import BlockRemoved, BlockStored, KVEventBatch, encode_event_batch

PLACEHOLDER = b"\x00kvstate-hostile-placeholder\x00"
WRONG_VALUES: tuple[Any, ...] = (True, False, 4.0, -0.5, float("nan"), b"\x01\x02", "x", [], [[1]],
                                 {"a": 1}, None, 2**64 - 1, -(2**63), [True], [1.5], [b"\x01"])
VALID_KINDS = frozenset({"deep_unknown_key", "extra_keys", "extreme_ints"})


def valid_payload(index: int, wire_format: str = "map") -> bytes:
    """A small valid batch whose ``ts`` is ``index`` (so tests can tell batches apart)."""
    stored = BlockStored([index], None, [1, 2, 3, 4], 4, None, "GPU", None)
    return encode_event_batch(KVEventBatch(float(index), [stored, BlockRemoved([index], "GPU")], 0),
                              wire_format)  # type: ignore[arg-type]


def sized_payload(size: int) -> bytes:
    """A valid batch of exactly ``size`` bytes (at least 64): padded with an unknown
    key, so payloads land on either side of a byte limit."""
    base = pack_batch([stored_map(pad="")])
    pad = max(size - len(base), 0)
    for extra in range(4):  # the string header grows by a few bytes with its length
        packed = pack_batch([stored_map(pad="p" * max(pad - extra, 0))])
        if len(packed) <= size:
            return packed
    return packed


def stored_map(**overrides: Any) -> dict[str, Any]:
    fields = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
              "token_ids": [1, 2, 3, 4], "block_size": 4, "lora_id": None, "medium": "GPU",
              "lora_name": None}
    fields.update(overrides)
    return fields


def pack_batch(events: list[Any], ts: Any = 0.0, rank: Any = None) -> bytes:
    return msgpack.packb([ts, events, rank], use_bin_type=True)  # type: ignore[no-any-return]


def nested_array(depth: int, inner: bytes = b"\x01") -> bytes:
    """``depth`` one-element arrays around ``inner``, as raw msgpack (packb stops at 512)."""
    return b"\x91" * depth + inner


def with_raw(events: list[Any], raw: bytes) -> bytes:
    """Pack a batch whose value ``PLACEHOLDER`` is replaced by the raw msgpack ``raw``."""
    packed = pack_batch(events)
    marker = msgpack.packb(PLACEHOLDER, use_bin_type=True)
    return packed.replace(marker, raw, 1)


def _wrong_field(rng: random.Random) -> bytes:
    field = rng.choice(["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                        "medium", "extra_keys", "group_idx", "lookahead_token_ids"])
    return pack_batch([stored_map(**{field: rng.choice(WRONG_VALUES)})])


def _missing_key(rng: random.Random) -> bytes:
    event = stored_map()
    del event[rng.choice(["type", "block_hashes", "parent_block_hash", "token_ids", "block_size"])]
    return pack_batch([event])


def _extra_keys(rng: random.Random) -> bytes:
    junk = {f"k{i}": rng.choice(WRONG_VALUES) for i in range(rng.randrange(1, 6))}
    return pack_batch([stored_map(**junk)], ts=1.0, rank=0)


def _truncated(rng: random.Random) -> bytes:
    whole = valid_payload(rng.randrange(1000))
    return whole[: rng.randrange(len(whole))]


PAYLOAD_KINDS: dict[str, Callable[[random.Random], bytes]] = {
    "random_bytes": lambda rng: rng.randbytes(rng.randrange(0, 2048)),
    "big_junk": lambda rng: rng.randbytes(rng.randrange(50_000, 100_001)),
    "deep_extra_keys": lambda rng: with_raw(
        [stored_map(extra_keys=[PLACEHOLDER])], nested_array(rng.randrange(17, 1000))),
    "deep_unknown_key": lambda rng: with_raw(
        [stored_map(junk=PLACEHOLDER)], nested_array(rng.randrange(1, 1000))),
    "deep_events": lambda rng: with_raw([PLACEHOLDER], nested_array(rng.randrange(1, 1000))),
    "too_deep_for_msgpack": lambda rng: with_raw([PLACEHOLDER], nested_array(rng.randrange(1100, 5000))),
    "wrong_tag": lambda rng: pack_batch(
        [rng.choice([{"type": rng.choice(WRONG_VALUES)}, [rng.choice(WRONG_VALUES), [1], "GPU"]])]),
    "wrong_field": _wrong_field,
    "bool_as_int": lambda rng: pack_batch([stored_map(block_size=True, block_hashes=[False])]),
    "float_as_int": lambda rng: pack_batch([stored_map(block_size=4.0, token_ids=[1.0, 2.0])]),
    "bytes_as_tokens": lambda rng: pack_batch([stored_map(token_ids=rng.randbytes(4))]),
    "missing_key": _missing_key,
    "extra_keys": _extra_keys,
    "extreme_ints": lambda rng: pack_batch(
        [stored_map(block_hashes=[2**64 - 1, -(2**63)], parent_block_hash=2**64 - 1)], ts=2**64 - 1),
    "declared_huge_array": lambda rng: b"\x93\xcb" + bytes(8) + b"\xdd\xff\xff\xff\xff\x90",
    "declared_huge_string": lambda rng: pack_batch([]).replace(b"\x90", b"\xdb\xff\xff\xff\xf0ab", 1),
    "truncated": _truncated,
    "ext_type": lambda rng: pack_batch([msgpack.ExtType(5, b"\x00" * 8)]),
    "int_map_keys": lambda rng: msgpack.packb([0.0, [{1: 2}], None]),
    "not_a_batch": lambda rng: msgpack.packb(rng.choice([None, 7, "batch", {"ts": 0.0}, [0.0]])),
}


def hostile_payload(rng: random.Random) -> tuple[str, bytes]:
    """One ``(kind, payload)`` drawn uniformly over :data:`PAYLOAD_KINDS`."""
    kind = rng.choice(sorted(PAYLOAD_KINDS))
    return kind, PAYLOAD_KINDS[kind](rng)
