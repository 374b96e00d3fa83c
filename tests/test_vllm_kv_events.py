"""KV-event wire compatibility: vLLM 0.33 map form, legacy array form, SGLang variants.

The ``VLLM_*`` hex constants were produced by vLLM 0.33.0's own msgspec encoder
(``tools/vllm_wire_probe.py --emit``); the ``SGLANG_*`` ones by SGLang 0.5.23's.
"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstate.vllm.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventDecodeError,
    KVEventEncodeError,
    decode_event_batch,
    encode_event_batch,
)

H0 = 2164874634404590027
H1 = 17270480062156288726

REFERENCE_BATCH = KVEventBatch(
    ts=1700000000.0,
    events=[
        BlockStored(
            block_hashes=[H0, H1],
            parent_block_hash=None,
            token_ids=list(range(1, 9)),
            block_size=4,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            extra_keys=None,
            group_idx=0,
            kv_cache_spec_kind="full_attention",
            kv_cache_spec_sliding_window=None,
        ),
        BlockRemoved(block_hashes=[H1], medium="GPU", group_idx=0),
        AllBlocksCleared(),
    ],
    data_parallel_rank=0,
)

# Reference §2.4, 126 bytes, annotated there field by field.
REFERENCE_ARRAY_HEX = (
    "93cb41d954fc400000009"
    "39cab426c6f636b53746f72656492cf1e0b2e028ef071cbcfefad121d154ab2d6c0"
    "98010203040506070804c0a3475055c0c000ae66756c6c5f617474656e74696f6ec0"
    "94ac426c6f636b52656d6f76656491cfefad121d154ab2d6a347505500"
    "91b0416c6c426c6f636b73436c656172656400"
)

VLLM_REFERENCE_MAP_HEX = (
    "93cb41d954fc4000000093de000aa474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865"
    "7392cf1e0b2e028ef071cbcfefad121d154ab2d6b1706172656e745f626c6f636b5f68617368c0a9746f6b"
    "656e5f696473980102030405060708aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756d"
    "a3475055a96c6f72615f6e616d65c0a967726f75705f69647800b26b765f63616368655f737065635f6b69"
    "6e64ae66756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f"
    "68617368657391cfefad121d154ab2d6a66d656469756da3475055a967726f75705f6964780081a4747970"
    "65b0416c6c426c6f636b73436c656172656400"
)

ALL_FIELDS_BATCH = KVEventBatch(
    ts=12.25,
    events=[
        BlockStored(
            block_hashes=[b"\x01" * 32, 5],
            parent_block_hash=2**63 + 5,
            token_ids=[0, 1, 300, 70000, 2**33],
            block_size=2,
            lora_id=3,
            medium="CPU",
            lora_name="adapter-x",
            extra_keys=[("adapter-x", ("img", -3), "salt"), None],
            group_idx=1,
            kv_cache_spec_kind="sliding_window",
            kv_cache_spec_sliding_window=128,
            locality="LOCAL",
            ownership="tier2",
            session_id="sess",
            lookahead_token_ids=[[1, 2], [3]],
        ),
        BlockRemoved(block_hashes=[b"\xff" * 16], medium=None, group_idx=2, locality="REMOTE", ownership="o"),
    ],
    data_parallel_rank=None,
)
VLLM_ALL_FIELDS_MAP_HEX = (
    "93cb402880000000000092de0010a474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865"
    "7392c4200101010101010101010101010101010101010101010101010101010101010101"
    "05b1706172656e745f626c6f636b5f68617368cf8000000000000005a9746f6b656e5f696473950001cd01"
    "2cce00011170cf0000000200000000aa626c6f636b5f73697a6502a76c6f72615f696403a66d656469756d"
    "a3435055a96c6f72615f6e616d65a9616461707465722d78aa65787472615f6b6579739293a96164617074"
    "65722d7892a3696d67fda473616c74c0a967726f75705f69647801b26b765f63616368655f737065635f6b"
    "696e64ae736c6964696e675f77696e646f77bc6b765f63616368655f737065635f736c6964696e675f7769"
    "6e646f77cc80a86c6f63616c697479a54c4f43414ca96f776e657273686970a57469657232aa7365737369"
    "6f6e5f6964a473657373b36c6f6f6b61686561645f746f6b656e5f69647392920102910386a474797065ac"
    "426c6f636b52656d6f766564ac626c6f636b5f68617368657391c410ffffffffffffffffffffffffffffff"
    "ffa66d656469756dc0a967726f75705f69647802a86c6f63616c697479a652454d4f5445a96f776e657273"
    "686970a16fc0"
)

NONE_KEYS_BATCH = KVEventBatch(
    ts=0.5,
    events=[
        BlockStored(
            block_hashes=[1, 2],
            parent_block_hash=9,
            token_ids=[1, 2, 3, 4],
            block_size=2,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            extra_keys=[None, None],
        )
    ],
    data_parallel_rank=3,
)
VLLM_NONE_KEYS_MAP_HEX = (
    "93cb3fe000000000000091de0009a474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865"
    "73920102b1706172656e745f626c6f636b5f6861736809a9746f6b656e5f6964739401020304aa626c6f63"
    "6b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472"
    "615f6b65797392c0c003"
)
VLLM_EMPTY_MAP_HEX = "93cb3ff000000000000090c0"

# SGLang 0.5.23 (map form, signed int64 hashes, cache_salt/session_id keys, attn_dp_rank=1).
SGLANG_MAP_HEX = (
    "93cb3ff80000000000009381a474797065b0416c6c426c6f636b73436c65617265648aa474797065ab426c"
    "6f636b53746f726564ac626c6f636b5f68617368657392d3cf97adeedb59e05bcf7f29db81043ea2c3b170"
    "6172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473980102030401020304aa626c6f636b5f"
    "73697a6504a76c6f72615f6964c0a66d656469756da3475055aa63616368655f73616c74a473616c74aa73"
    "657373696f6e5f6964a27331a96c6f72615f6e616d65a26c6f83a474797065ac426c6f636b52656d6f7665"
    "64ac626c6f636b5f68617368657391d3cf97adeedb59e05ba66d656469756daa4350555f50494e4e454401"
)
# SGLang 0.5.23 with medium and lora_name left out (None), and no rank.
SGLANG_MINIMAL_MAP_HEX = (
    "93cb40000000000000009286a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391"
    "7bb1706172656e745f626c6f636b5f68617368fba9746f6b656e5f696473920102aa626c6f636b5f73697a"
    "6502a76c6f72615f6964c082a474797065ac426c6f636b52656d6f766564ac626c6f636b5f686173686573"
    "917bc0"
)
# Older SGLang positional form (reference sglang.md §2.3, msgspec 0.22).
SGLANG_ARRAY_HEX = (
    "93cb3ff8000000000000"
    "93"
    "91b0416c6c426c6f636b73436c6561726564"
    "97ab426c6f636b53746f726564917bc092010202c0a3475055"
    "93ac426c6f636b52656d6f766564917ba3475055"
    "00"
)


# ------------------------------------------------------------------ encoding


def test_array_form_matches_reference_example_byte_for_byte() -> None:
    encoded = encode_event_batch(REFERENCE_BATCH, format="array")
    assert len(encoded) == 126
    assert encoded.hex() == REFERENCE_ARRAY_HEX


@pytest.mark.parametrize(
    ("batch", "expected_hex"),
    [
        (REFERENCE_BATCH, VLLM_REFERENCE_MAP_HEX),
        (ALL_FIELDS_BATCH, VLLM_ALL_FIELDS_MAP_HEX),
        (NONE_KEYS_BATCH, VLLM_NONE_KEYS_MAP_HEX),
        (KVEventBatch(ts=1.0, events=[]), VLLM_EMPTY_MAP_HEX),
    ],
)
def test_map_form_matches_vllm_033_bytes(batch: KVEventBatch, expected_hex: str) -> None:
    assert encode_event_batch(batch).hex() == expected_hex
    assert encode_event_batch(batch, format="map").hex() == expected_hex
    assert decode_event_batch(bytes.fromhex(expected_hex)) == batch


def test_map_form_uses_map16_header_for_block_stored() -> None:
    # msgspec sizes the header by BlockStored's 16 possible entries.
    encoded = encode_event_batch(NONE_KEYS_BATCH)
    assert encoded[10:14] == bytes.fromhex("91de0009")
    removed_only = encode_event_batch(KVEventBatch(ts=0.0, events=[BlockRemoved([1], "GPU")]))
    assert removed_only[10:12] == bytes.fromhex("9183")


def test_minimal_block_stored_array_is_twelve_elements() -> None:
    batch = KVEventBatch(ts=0.0, events=[BlockStored([7], None, [1, 2], 2, None, "GPU", None)])
    encoded = encode_event_batch(batch, format="array")
    event_bytes = encoded[11:-1]  # after 93, the float64 ts and the events header
    expected = bytes.fromhex("9cab") + b"BlockStored" + bytes.fromhex("9107c092010202c0a3")
    expected += b"GPU" + bytes.fromhex("c0c0c0c0c0")
    assert event_bytes == expected
    assert len(event_bytes) == 30


def test_array_form_appends_post_snapshot_fields_only_when_set() -> None:
    stored = BlockStored([1], None, [1], 1, None, "GPU", None, session_id="s")
    removed = BlockRemoved([1], "GPU", locality="LOCAL")
    wire = msgpack.unpackb(encode_event_batch(KVEventBatch(0.0, [stored, removed]), "array"))
    assert len(wire[1][0]) == 15 and wire[1][0][14] == "s" and wire[1][0][12:14] == [None, None]
    assert wire[1][1] == ["BlockRemoved", [1], "GPU", None, "LOCAL"]
    assert decode_event_batch(encode_event_batch(KVEventBatch(0.0, [stored, removed]), "array")) == (
        KVEventBatch(0.0, [stored, removed])
    )


def test_encode_rejects_bad_format_and_unencodable_values() -> None:
    with pytest.raises(ValueError, match="format"):
        encode_event_batch(REFERENCE_BATCH, format="json")  # type: ignore[arg-type]
    too_big = KVEventBatch(0.0, [BlockRemoved([2**64], "GPU")])
    with pytest.raises(KVEventEncodeError):
        encode_event_batch(too_big)
    with pytest.raises(KVEventEncodeError, match="not a KV cache event"):
        encode_event_batch(KVEventBatch(0.0, ["BlockStored"]))  # type: ignore[list-item]


def test_events_are_immutable_and_hashable() -> None:
    stored = BlockStored([1, 2], None, [3, 4], 2, None, "GPU", None, extra_keys=[["a", ["b", 1]]])
    assert stored.block_hashes == (1, 2) and stored.token_ids == (3, 4)
    assert stored.extra_keys == (("a", ("b", 1)),)
    same = BlockStored((1, 2), None, (3, 4), 2, None, "GPU", None, extra_keys=[("a", ("b", 1))])
    assert stored == same and hash(stored) == hash(same)
    with pytest.raises(AttributeError):
        stored.block_size = 3  # type: ignore[misc]


# ------------------------------------------------------------------ decoding other producers


def test_decode_reference_array_form() -> None:
    assert decode_event_batch(bytes.fromhex(REFERENCE_ARRAY_HEX)) == REFERENCE_BATCH


def test_decode_sglang_map_form() -> None:
    batch = decode_event_batch(bytes.fromhex(SGLANG_MAP_HEX))
    assert batch.ts == 1.5 and batch.data_parallel_rank == 1
    cleared, stored, removed = batch.events
    assert cleared == AllBlocksCleared()
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == (-3488128144981237669, 9163096264030462659)
    assert stored.token_ids == (1, 2, 3, 4, 1, 2, 3, 4)
    assert stored.lora_name == "lo" and stored.session_id == "s1" and stored.medium == "GPU"
    assert removed == BlockRemoved([-3488128144981237669], "CPU_PINNED")


def test_decode_sglang_map_form_without_optional_fields() -> None:
    batch = decode_event_batch(bytes.fromhex(SGLANG_MINIMAL_MAP_HEX))
    assert batch == KVEventBatch(
        ts=2.0,
        events=[BlockStored([123], -5, [1, 2], 2, None, None, None), BlockRemoved([123], None)],
        data_parallel_rank=None,
    )


def test_decode_sglang_array_form() -> None:
    batch = decode_event_batch(bytes.fromhex(SGLANG_ARRAY_HEX))
    assert batch == KVEventBatch(
        ts=1.5,
        events=[
            AllBlocksCleared(),
            BlockStored([123], None, [1, 2], 2, None, "GPU", None),
            BlockRemoved([123], "GPU"),
        ],
        data_parallel_rank=0,
    )


def test_decode_oldest_vllm_schema_and_ignores_unknown_trailing_data() -> None:
    # vLLM #16750: BlockStored had five fields; a two-element batch has no rank.
    oldest = msgpack.packb([3.0, [["BlockStored", [1], None, [5], 1, 4], ["BlockRemoved", [1]]]])
    assert decode_event_batch(oldest) == KVEventBatch(
        3.0, [BlockStored([1], None, [5], 1, 4, None, None), BlockRemoved([1], None)]
    )
    future = msgpack.packb(
        [1, [{"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", "new": 5}], 0, "x"]
    )
    assert decode_event_batch(future) == KVEventBatch(1.0, [BlockRemoved([1], "GPU")], 0)


# ------------------------------------------------------------------ malformed input


def _pack(value: object) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


GOOD_STORED = {
    "type": "BlockStored",
    "block_hashes": [1],
    "parent_block_hash": None,
    "token_ids": [1],
    "block_size": 1,
    "lora_id": None,
    "medium": "GPU",
    "lora_name": None,
}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "msgpack"),
        (b"\xc1", "msgpack"),
        (_pack([1.0, []])[:-1], "msgpack"),
        (_pack([1.0, [], None]) + b"\x00", "msgpack"),
        (_pack({"ts": 1.0}), "expected an array"),
        (_pack([1.0]), "2 elements|1 elements"),
        (_pack(["now", []]), "ts"),
        (_pack([True, []]), "ts"),
        (_pack([1.0, {}]), "events"),
        (_pack([1.0, [5]]), "map or an array"),
        (_pack([1.0, [["BlockEvicted", [1]]]]), "unknown"),
        (_pack([1.0, [[]]]), "unknown"),
        (_pack([1.0, [{"type": "Nope"}]]), "unknown"),
        (_pack([1.0, [{"block_hashes": [1]}]]), "unknown"),
        (_pack([1.0, [{"type": "BlockStored", "block_hashes": [1]}]]), "lacks"),
        (_pack([1.0, [["BlockStored", [1], None, [1]]]]), "only 3 fields"),
        (_pack([1.0, [{**GOOD_STORED, "block_hashes": ["abc"]}]]), "block_hashes"),
        (_pack([1.0, [{**GOOD_STORED, "token_ids": [1.5]}]]), "token_ids"),
        (_pack([1.0, [{**GOOD_STORED, "token_ids": [True]}]]), "token_ids"),
        (_pack([1.0, [{**GOOD_STORED, "block_size": None}]]), "block_size"),
        (_pack([1.0, [{**GOOD_STORED, "medium": 3}]]), "medium"),
        (_pack([1.0, [{**GOOD_STORED, "extra_keys": ["salt"]}]]), "extra_keys"),
        (_pack([1.0, [{**GOOD_STORED, "extra_keys": [[{"a": 1}]]}]]), "extra-key"),
        (_pack([1.0, [{**GOOD_STORED, "lookahead_token_ids": [5]}]]), "lookahead"),
        (_pack([1.0, [], "rank"]), "data_parallel_rank"),
        (_pack([1.0, [{1: "BlockStored"}]]), "msgpack"),
        (msgpack.packb([1.0, [msgpack.ExtType(5, b"xx")]]), "msgpack"),
        (b"\x91" * 5000 + b"\xc0", "msgpack|expected"),
    ],
)
def test_malformed_input_raises_typed_error(data: bytes, message: str) -> None:
    with pytest.raises(KVEventDecodeError, match=message):
        decode_event_batch(data)


def test_decode_rejects_non_bytes() -> None:
    with pytest.raises(KVEventDecodeError, match="bytes"):
        decode_event_batch("93")  # type: ignore[arg-type]


def test_decode_error_is_a_value_error() -> None:
    assert issubclass(KVEventDecodeError, ValueError)


# ------------------------------------------------------------------ round trips

_hash = st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.binary(min_size=8, max_size=32)
_maybe_str = st.none() | st.text(max_size=8)
_maybe_int = st.none() | st.integers(min_value=0, max_value=2**31)
_key_atom = st.text(max_size=6) | st.integers(-(2**40), 2**40) | st.binary(max_size=8)
_stored = st.builds(
    BlockStored,
    block_hashes=st.lists(_hash, max_size=4),
    parent_block_hash=st.none() | _hash,
    token_ids=st.lists(st.integers(min_value=0, max_value=2**32), max_size=8),
    block_size=st.integers(min_value=1, max_value=64),
    lora_id=_maybe_int,
    medium=_maybe_str,
    lora_name=_maybe_str,
    extra_keys=st.none()
    | st.lists(st.none() | st.lists(_key_atom | st.tuples(_key_atom, _key_atom), max_size=3), max_size=3),
    group_idx=_maybe_int,
    kv_cache_spec_kind=_maybe_str,
    kv_cache_spec_sliding_window=_maybe_int,
    locality=_maybe_str,
    ownership=_maybe_str,
    session_id=_maybe_str,
    lookahead_token_ids=st.none() | st.lists(st.lists(st.integers(0, 1000), max_size=2), max_size=2),
)
_removed = st.builds(
    BlockRemoved,
    block_hashes=st.lists(_hash, max_size=4),
    medium=_maybe_str,
    group_idx=_maybe_int,
    locality=_maybe_str,
    ownership=_maybe_str,
)
_batch = st.builds(
    KVEventBatch,
    ts=st.floats(allow_nan=False),
    events=st.lists(_stored | _removed | st.just(AllBlocksCleared()), max_size=5),
    data_parallel_rank=_maybe_int,
)


@settings(max_examples=150, deadline=None)
@given(_batch, st.sampled_from(["map", "array"]))
def test_round_trip_both_forms(batch: KVEventBatch, wire_format: str) -> None:
    encoded = encode_event_batch(batch, format=wire_format)  # type: ignore[arg-type]
    assert decode_event_batch(encoded) == batch


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_typed_error(data: bytes) -> None:
    try:
        batch = decode_event_batch(data)
    except KVEventDecodeError:
        return
    assert isinstance(batch, KVEventBatch)
