"""Block hashing compatible with vLLM 0.33 (``sha256_cbor``) and the CBOR encoder.

The expected digests below were produced by vLLM 0.33.0 itself
(``tools/vllm_wire_probe.py --emit`` in the peer venv: ``init_none_hash``,
``Request`` with ``get_request_block_hasher(block_size, sha256_cbor)``).
"""

from __future__ import annotations

import hashlib
import importlib.util

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstate.vllm.cbor import CborEncodeError, encode_canonical
from kvstate.vllm.hashing import (
    DEFAULT_NONE_HASH_SEED,
    MultiModalSpan,
    block_extra_keys,
    block_hash_with_group_id,
    external_block_hash,
    hash_block_tokens,
    none_hash,
    request_block_hashes,
    sglang_event_hash,
    sglang_page_hash,
    sha256_cbor,
    sha256_pickle,
    to_event_extra_keys,
)

# ------------------------------------------------------------------ CBOR, hard-coded bytes


@pytest.mark.parametrize(
    ("value", "expected_hex"),
    [
        (None, "f6"),
        (True, "f5"),
        (False, "f4"),
        (0, "00"),
        (23, "17"),
        (24, "1818"),
        (255, "18ff"),
        (256, "190100"),
        (65535, "19ffff"),
        (65536, "1a00010000"),
        (2**32 - 1, "1affffffff"),
        (2**32, "1b0000000100000000"),
        (2**64 - 1, "1bffffffffffffffff"),
        (2**64, "c249010000000000000000"),
        (-1, "20"),
        (-24, "37"),
        (-25, "3818"),
        (-(2**64), "3bffffffffffffffff"),
        (-(2**64) - 1, "c349010000000000000000"),
        (b"", "40"),
        (b"\x01\x02", "420102"),
        (bytes(32), "5820" + "00" * 32),
        ("", "60"),
        ("0", "6130"),
        ("é", "62c3a9"),
        ((), "80"),
        ([], "80"),
        ((1, (2, "x"), b""), "83018202617840"),
        (list(range(24)), "9818" + "".join(f"{i:02x}" for i in range(24))),
        ({"b": 1, "aa": 2, "a": 3, 10: 1, -1: 2}, "a50a01200261610361620162616102"),
        (1.5, "f93e00"),
        (1.0, "f93c00"),
        (65504.0, "f97bff"),
        (0.1, "fb3fb999999999999a"),
        (float("inf"), "f97c00"),
        (float("nan"), "f97e00"),
    ],
)
def test_cbor_canonical_bytes(value: object, expected_hex: str) -> None:
    assert encode_canonical(value).hex() == expected_hex


def test_cbor_rejects_unsupported_types() -> None:
    with pytest.raises(CborEncodeError, match="set"):
        encode_canonical({1, 2})
    with pytest.raises(CborEncodeError, match="object"):
        encode_canonical((1, object()))


def test_cbor_rejects_runaway_nesting() -> None:
    value: list[object] = []
    for _ in range(300):
        value = [value]
    with pytest.raises(CborEncodeError, match="nesting"):
        encode_canonical(value)


_cbor_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.binary(max_size=40)
    | st.text(max_size=20)
    | st.floats(allow_nan=False),
    lambda children: (
        st.lists(children, max_size=5)
        | st.tuples(children, children)
        | st.dictionaries(st.integers(-300, 300) | st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=20,
)


@pytest.mark.skipif(importlib.util.find_spec("cbor2") is None, reason="cbor2 not installed")
@settings(max_examples=300, deadline=None)
@given(_cbor_values)
def test_cbor_matches_cbor2_canonical(value: object) -> None:
    import cbor2

    assert encode_canonical(value) == cbor2.dumps(value, canonical=True)


# ------------------------------------------------------------------ NONE_HASH

NONE_HASH_DEFAULT = "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"
NONE_HASH_SEED_0 = "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
NONE_HASH_SEED_42 = "9fa6eb003f14425eb9c8e6baacfbcaab26257357b829c7bfa74ffcc4f31c1780"
NONE_HASH_SEED_EMPTY = "8d33f520a3c4cef80d2453aef81b612bfe1cb44c8b2025630ad38662763f13d3"


@pytest.mark.parametrize(
    ("seed", "expected_hex"),
    [
        (None, NONE_HASH_DEFAULT),
        ("0", NONE_HASH_SEED_0),
        (0, NONE_HASH_SEED_0),
        ("42", NONE_HASH_SEED_42),
        ("", NONE_HASH_SEED_EMPTY),
    ],
)
def test_none_hash_matches_vllm(seed: str | int | None, expected_hex: str) -> None:
    assert none_hash(seed).hex() == expected_hex


def test_none_hash_default_is_the_fixed_string() -> None:
    assert DEFAULT_NONE_HASH_SEED == "vllm-none-hash"
    assert none_hash(None) == hashlib.sha256(b"\x6evllm-none-hash").digest()


def test_none_hash_rejects_bad_seed_type() -> None:
    with pytest.raises(TypeError, match="hash_seed"):
        none_hash(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="hash_seed"):
        none_hash(True)


# ------------------------------------------------------------------ reference §2.4


def test_reference_byte_level_example() -> None:
    assert encode_canonical("0").hex() == "6130"
    seed_hash = none_hash("0")
    assert seed_hash == hashlib.sha256(bytes.fromhex("6130")).digest()
    first_input = encode_canonical((seed_hash, (1, 2, 3, 4), None))
    assert first_input == bytes.fromhex("835820") + seed_hash + bytes.fromhex("8401020304f6")
    h0 = hash_block_tokens(None, [1, 2, 3, 4], None, hash_seed="0")
    assert h0 == hashlib.sha256(first_input).digest()
    assert h0.hex().startswith("c9d58ba6") and h0.hex().endswith("1e0b2e028ef071cb")
    assert external_block_hash(h0) == 0x1E0B2E028EF071CB == 2164874634404590027
    h1 = hash_block_tokens(h0, (5, 6, 7, 8), None, hash_seed="0")
    assert h1 == sha256_cbor((h0, (5, 6, 7, 8), None))
    assert h1.hex().startswith("24125b23") and h1.hex().endswith("efad121d154ab2d6")
    assert external_block_hash(h1) == 17270480062156288726


# ------------------------------------------------------------------ request hashes (vLLM 0.33)


def test_plain_request_hashes_seed0() -> None:
    hashes = request_block_hashes(list(range(1, 11)), 4, hash_seed="0")
    assert [h.hex() for h in hashes] == [
        "c9d58ba695280d69b243e1e0df813136ca9196b286fb1a021e0b2e028ef071cb",
        "24125b23e68883b5c2141db2959d48433fe6bde2f26bd914efad121d154ab2d6",
    ]


def test_plain_request_hashes_default_seed() -> None:
    hashes = request_block_hashes(list(range(1, 11)), 4)
    assert [external_block_hash(h) for h in hashes] == [9561501211280363793, 15292913576410714033]
    assert hashes[0].hex() == "58d0879dff3800f65f8c5fd449d73048c0f7699dd238a03b84b146b151d55111"


def test_large_token_ids_seed42() -> None:
    tokens = [0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 151_935]
    tokens += [7, 8, 9, 10, 11, 12, 100_000, 1, 2]
    hashes = request_block_hashes(tokens, 16, hash_seed="42")
    assert [h.hex() for h in hashes] == ["ea17b95ed5590573e89c515b3d46b6e33d405d22913a20ffc2455c52e6f61270"]


def test_lora_and_cache_salt_hashes() -> None:
    options = {"lora_name": "adapter-x", "lora_path": "/adapters/x", "cache_salt": "tenant-1"}
    hashes = request_block_hashes(list(range(12)), 4, **options)  # type: ignore[arg-type]
    assert [external_block_hash(h) for h in hashes] == [
        2965573375870322179,
        8625334474916283868,
        13654854371622845247,
    ]
    tagged = [block_extra_keys(4 * i, 4 * i + 4, **options) for i in range(3)]  # type: ignore[arg-type]
    lora_key = ("lora", "adapter-x", "/adapters/x")
    assert tagged == [(lora_key, ("cache_salt", "tenant-1")), (lora_key,), (lora_key,)]
    assert to_event_extra_keys(tagged) == [("adapter-x", "tenant-1"), ("adapter-x",), ("adapter-x",)]


def test_lora_name_equal_to_cache_salt_does_not_collide() -> None:
    lora_hashes = request_block_hashes(list(range(8)), 4, lora_name="same", lora_path="/p")
    salt_hashes = request_block_hashes(list(range(8)), 4, cache_salt="same")
    plain_hashes = request_block_hashes(list(range(8)), 4)
    assert [external_block_hash(h) for h in lora_hashes] == [
        10672536775309656205,
        8893711382308550367,
    ]
    assert [external_block_hash(h) for h in salt_hashes] == [
        13375010778551071209,
        2340118180829487214,
    ]
    assert len({lora_hashes[0], salt_hashes[0], plain_hashes[0]}) == 3
    # The salt is only on the first block, but chaining isolates the rest.
    assert block_extra_keys(4, 8, cache_salt="same") is None
    assert salt_hashes[1] != plain_hashes[1]


def test_multimodal_hashes_and_offsets() -> None:
    spans = [MultiModalSpan("img-a", 2, 5), MultiModalSpan("img-b", 9, 3), MultiModalSpan("img-c", 13, 6)]
    hashes = request_block_hashes(list(range(100, 120)), 4, hash_seed="0", mm_spans=spans)
    assert [external_block_hash(h) for h in hashes] == [
        13924572694030567291,
        133544736407281182,
        5475436145075226814,
        17441157171499872370,
        15592853616229222496,
    ]
    tagged = [block_extra_keys(4 * i, 4 * i + 4, mm_spans=spans) for i in range(5)]
    assert tagged == [
        (("mm", "img-a", 2),),
        (("mm", "img-a", -2),),
        (("mm", "img-b", 1),),
        (("mm", "img-c", 1),),
        (("mm", "img-c", -3),),
    ]
    assert to_event_extra_keys(tagged) == [
        (("img-a", 2),),
        (("img-a", -2),),
        (("img-b", 1),),
        (("img-c", 1),),
        (("img-c", -3),),
    ]


def test_incremental_hashing_after_appended_outputs() -> None:
    options = {"hash_seed": "7", "cache_salt": "s", "mm_spans": [MultiModalSpan("m", 1, 2)]}
    prompt = [5, 6, 7, 8, 9]
    first = request_block_hashes(prompt, 4, **options)  # type: ignore[arg-type]
    assert len(first) == 1
    tokens = prompt + [10, 11, 12, 13, 14]
    more = request_block_hashes(tokens, 4, known_hashes=first, **options)  # type: ignore[arg-type]
    assert [h.hex() for h in first + more] == [
        "a45bf599a0687e01bda1699c4f6cdfdc5174cbf123202b7966693d7136c8970f",
        "d88ad5596d2416a7093e634e3b654d3efd6dc3fa3498410fb96816a19839a787",
    ]
    assert first + more == request_block_hashes(tokens, 4, **options)  # type: ignore[arg-type]
    # Nothing new until another block fills.
    assert request_block_hashes(tokens, 4, known_hashes=first + more, **options) == []  # type: ignore[arg-type]


def test_only_full_blocks_are_hashed() -> None:
    assert request_block_hashes([1, 2, 3], 4) == []
    assert len(request_block_hashes(list(range(11)), 4)) == 2
    assert len(request_block_hashes(list(range(12)), 4)) == 3


def test_falsy_parent_means_first_block() -> None:
    first = hash_block_tokens(None, [1, 2], None)
    assert hash_block_tokens(b"", [1, 2], None) == first
    assert first == sha256_cbor((none_hash(None), (1, 2), None))
    assert hash_block_tokens(first, [1, 2], None) != first


def test_hash_block_tokens_rejects_non_int_tokens() -> None:
    with pytest.raises(TypeError, match="token ids"):
        hash_block_tokens(None, [1, "2"], None)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="token ids"):
        hash_block_tokens(None, [True], None)


def test_request_block_hashes_rejects_bad_block_size() -> None:
    with pytest.raises(ValueError, match="block_size"):
        request_block_hashes([1, 2], 0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=-(2**63), max_value=2**64 - 1), max_size=40),
    st.none() | st.binary(min_size=32, max_size=32),
)
def test_inline_token_encoding_equals_generic_cbor(tokens: list[int], parent: bytes | None) -> None:
    expected = sha256_cbor((parent or none_hash("3"), tuple(tokens), None))
    assert hash_block_tokens(parent, tokens, None, hash_seed="3") == expected


def test_external_hash_and_group_key() -> None:
    digest = bytes(range(32))
    assert external_block_hash(digest) == int.from_bytes(digest[-8:], "big")
    assert block_hash_with_group_id(digest, 2) == digest + b"\x00\x00\x00\x02"


def test_event_extra_keys_edge_cases() -> None:
    assert to_event_extra_keys(None) is None
    assert to_event_extra_keys([]) is None
    assert to_event_extra_keys([None, None]) == [None, None]
    assert block_extra_keys(0, 4, cache_salt="") is None


def test_sglang_page_hash_variant() -> None:
    # Checked against SGLang 0.5.23's get_hash_str / hash_str_to_int64.
    first = sglang_page_hash(None, [1, 2, 3, 4])
    second = sglang_page_hash(first, [1, 2, 3, 4])
    assert first.hex() == "cf97adeedb59e05bfd73a2b4c2a8885708c4f4f70c84c64b27120e72ab733b72"
    assert second.hex() == "7f29db81043ea2c317c918f43cf6998ee32bec7b82c5818c20d5e81d453c483d"
    assert sglang_event_hash(first) == -3488128144981237669
    assert sglang_event_hash(second) == 9163096264030462659
    with pytest.raises(ValueError, match="uint32"):
        sglang_page_hash(None, [2**32])


# vLLM 0.33 with its default prefix_caching_hash_algo="sha256" (pickle), same Python 3.11.
def test_sha256_pickle_algorithm_matches_vllm() -> None:
    plain = request_block_hashes(list(range(1, 11)), 4, hash_seed="0", hash_algo="sha256")
    assert [h.hex() for h in plain] == [
        "762b2e7e1520febd3a0aedb7358e8602facf3924440e18538fce057e23bae91d",
        "9e62b5a7ec298f33cb4c7d9e00b659874bb2432d23ad6879ad1746592a2b036b",
    ]
    default_seed = request_block_hashes(list(range(1, 11)), 4, hash_algo="sha256")
    assert [external_block_hash(h) for h in default_seed] == [1882140585328457242, 15284023028817948126]
    tenant = request_block_hashes(
        list(range(12)),
        4,
        hash_algo="sha256",
        lora_name="adapter-x",
        lora_path="/adapters/x",
        cache_salt="tenant-1",
    )
    assert [external_block_hash(h) for h in tenant] == [
        6109046382519848628,
        16381036274425806070,
        1570029293988145758,
    ]
    spans = [MultiModalSpan("img-a", 2, 5), MultiModalSpan("img-b", 9, 3), MultiModalSpan("img-c", 13, 6)]
    images = request_block_hashes(list(range(100, 120)), 4, hash_seed="0", hash_algo="sha256", mm_spans=spans)
    assert [external_block_hash(h) for h in images] == [
        13598522116873088514,
        17266896818065063184,
        16221662308337755660,
        6119245894975000777,
        14313068644276905245,
    ]
    assert none_hash("0", "sha256") == sha256_pickle("0")


def test_unknown_hash_algo_is_rejected() -> None:
    with pytest.raises(ValueError, match="hash_algo"):
        none_hash(None, "xxhash")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="hash_algo"):
        request_block_hashes([1, 2], 2, hash_algo="md5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="hash_algo"):
        hash_block_tokens(b"\x01" * 32, [1], None, hash_algo="md5")  # type: ignore[arg-type]
