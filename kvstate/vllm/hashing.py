"""vLLM 0.33-compatible prefix-cache block hashing (``sha256_cbor``).

A block hash is ``sha256(canonical_cbor((parent, tokens, extra_keys)))`` where
``parent`` is the previous full block's 32-byte digest (or ``NONE_HASH`` for
the first block), ``tokens`` is the block's token ids as a tuple, and
``extra_keys`` is a tuple of domain-tagged keys or ``None``.

``NONE_HASH`` is ``sha256_cbor(seed)``, where ``seed`` is the string vLLM reads
from ``PYTHONHASHSEED``; here it is the ``hash_seed`` argument, and when that is
``None`` the fixed default ``"vllm-none-hash"`` (what 0.33 uses for its
cryptographic hash algorithms when the variable is unset).

Extra keys, in vLLM 0.33's order (LoRA, multimodal, cache salt):

* LoRA: ``("lora", lora_name, lora_path)`` on every block;
* multimodal: ``("mm", identifier, item_offset - block_start)`` for each item
  overlapping the block (the offset is negative for an item begun earlier);
* cache salt: ``("cache_salt", salt)`` on the first block only, when non-empty.

The tags keep a LoRA name and an equal cache salt apart (vLLM issue #44701).
KV events publish the keys untagged (:func:`to_event_extra_keys`).

Everything here is a pure function of its arguments; nothing is mutated.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any, Literal

import attrs

from kvstate.vllm.cbor import encode_canonical

__all__ = [
    "DEFAULT_NONE_HASH_SEED",
    "HashAlgo",
    "MultiModalSpan",
    "block_extra_keys",
    "block_hash_with_group_id",
    "external_block_hash",
    "hash_block_tokens",
    "none_hash",
    "request_block_hashes",
    "sglang_event_hash",
    "sglang_page_hash",
    "sha256_cbor",
    "sha256_pickle",
    "to_event_extra_keys",
]

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
"""The seed vLLM 0.33 derives ``NONE_HASH`` from when ``PYTHONHASHSEED`` is unset."""

_LOW_64_BITS = (1 << 64) - 1


HashAlgo = Literal["sha256_cbor", "sha256"]
"""``sha256_cbor`` (reproducible anywhere) or vLLM's default ``sha256`` over a
pickle, which matches vLLM only on the same pickle protocol (Python 3.8+ gives
the same bytes for these plain tuples, bytes, ints and strings)."""


def sha256_cbor(value: Any) -> bytes:
    """SHA-256 digest (32 bytes) of the canonical CBOR encoding of ``value``."""
    return hashlib.sha256(encode_canonical(value)).digest()


def sha256_pickle(value: Any) -> bytes:
    """vLLM's ``sha256``: SHA-256 of ``pickle.dumps(value, HIGHEST_PROTOCOL)`` (dumps only)."""
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


@lru_cache(maxsize=64)
def _none_hash_for_seed(seed: str, hash_algo: HashAlgo) -> bytes:
    if hash_algo == "sha256":
        return sha256_pickle(seed)
    return sha256_cbor(seed)


def _check_algo(hash_algo: str) -> None:
    if hash_algo not in ("sha256_cbor", "sha256"):
        raise ValueError(f"hash_algo must be 'sha256_cbor' or 'sha256', not {hash_algo!r}")


def none_hash(hash_seed: str | int | None = None, hash_algo: HashAlgo = "sha256_cbor") -> bytes:
    """The chain seed ``NONE_HASH`` for a given ``PYTHONHASHSEED``-equivalent.

    ``hash_seed`` is the string value of ``PYTHONHASHSEED`` (an ``int`` is
    converted with ``str``, so ``0`` and ``"0"`` agree); ``None`` means unset and
    selects :data:`DEFAULT_NONE_HASH_SEED`.
    """
    if hash_seed is None:
        seed = DEFAULT_NONE_HASH_SEED
    elif isinstance(hash_seed, bool) or not isinstance(hash_seed, (str, int)):
        raise TypeError(f"hash_seed must be str, int or None, not {type(hash_seed).__name__}")
    else:
        seed = str(hash_seed)
    _check_algo(hash_algo)
    return _none_hash_for_seed(seed, hash_algo)


def _build_uint16_table() -> tuple[bytes, ...]:
    tiny = [bytes((value,)) for value in range(24)]
    small = [b"\x18" + bytes((value,)) for value in range(24, 256)]
    wide = [b"\x19" + value.to_bytes(2, "big") for value in range(256, 1 << 16)]
    return tuple(tiny + small + wide)


_UINT16_CBOR: tuple[bytes, ...] = ()


def _encode_tokens(token_ids: Sequence[int]) -> bytes:
    """Canonical CBOR array of ints; the bulk of every block hash, so it uses a
    table of the encodings of 0..65535 (built on first use, about 3 MB)."""
    global _UINT16_CBOR
    if not _UINT16_CBOR:
        _UINT16_CBOR = _build_uint16_table()
    count = len(token_ids)
    if count < 24:
        head = bytes((0x80 | count,))
    else:
        count_head = encode_canonical(count)
        head = bytes((count_head[0] | 0x80,)) + count_head[1:]  # major type 0 -> 4
    if token_ids and 0 <= min(token_ids) and max(token_ids) < 0x10000:
        table = _UINT16_CBOR
        return head + b"".join([table[token_id] for token_id in token_ids])
    return head + b"".join([encode_canonical(token_id) for token_id in token_ids])


def hash_int_block(parent: bytes, token_ids: Sequence[int],
                   extra_keys: tuple[Any, ...] | None, hash_algo: HashAlgo) -> bytes:
    """``hash_block_tokens`` for a caller whose tokens are already checked ints and whose
    parent is a real digest (a request hashing its own blocks): the same digest."""
    if hash_algo != "sha256_cbor" or len(parent) != 32:
        return hash_block_tokens(parent, token_ids, extra_keys, hash_algo=hash_algo)
    extra_cbor = b"\xf6" if extra_keys is None else encode_canonical(extra_keys)
    return hashlib.sha256(b"\x83\x58\x20" + parent + _encode_tokens(token_ids)
                          + extra_cbor).digest()


def hash_block_tokens(
    parent_hash: bytes | None,
    token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
    *,
    hash_seed: str | int | None = None,
    hash_algo: HashAlgo = "sha256_cbor",
) -> bytes:
    """Digest of one full block chained onto ``parent_hash``.

    A falsy ``parent_hash`` (``None`` or ``b""``) means "first block" and is
    replaced by ``none_hash(hash_seed, hash_algo)``, as vLLM does.
    ``extra_keys`` must already be tagged (see :func:`block_extra_keys`).
    """
    parent = parent_hash if parent_hash else none_hash(hash_seed, hash_algo)
    if not all(type(token_id) is int for token_id in token_ids):
        for token_id in token_ids:
            if isinstance(token_id, bool) or not isinstance(token_id, int):
                raise TypeError(f"token ids must be ints, got {token_id!r}")
        token_ids = [int(token_id) for token_id in token_ids]
    if hash_algo != "sha256_cbor":
        _check_algo(hash_algo)
        return sha256_pickle((parent, tuple(token_ids), extra_keys))
    parent_cbor = b"\x58\x20" + parent if len(parent) == 32 else encode_canonical(bytes(parent))
    extra_cbor = b"\xf6" if extra_keys is None else encode_canonical(extra_keys)
    return hashlib.sha256(b"\x83" + parent_cbor + _encode_tokens(token_ids) + extra_cbor).digest()


def external_block_hash(block_hash: bytes) -> int:
    """The 64-bit hash vLLM publishes in KV events: the digest's low 64 bits
    (its last 8 bytes read big-endian)."""
    return int.from_bytes(block_hash, "big") & _LOW_64_BITS


def block_hash_with_group_id(block_hash: bytes, group_id: int) -> bytes:
    """vLLM's cache-map key: the digest followed by the group id as 4 big-endian bytes."""
    return bytes(block_hash) + group_id.to_bytes(4, "big", signed=False)


@attrs.frozen
class MultiModalSpan:
    """One multimodal item's placeholder span in a prompt.

    ``identifier`` is the item's content hash (vLLM's ``mm_feature.identifier``);
    ``offset`` and ``length`` are in tokens.
    """

    identifier: str
    offset: int
    length: int


def block_extra_keys(
    start_token_index: int,
    end_token_index: int,
    *,
    lora_name: str | None = None,
    lora_path: str = "",
    mm_spans: Sequence[MultiModalSpan] = (),
    cache_salt: str | None = None,
) -> tuple[Any, ...] | None:
    """The tagged extra keys of the block ``[start_token_index, end_token_index)``.

    Returns ``None`` when there are none, as vLLM does.  ``mm_spans`` must be
    sorted by offset.  vLLM requires a non-empty ``lora_path`` for a LoRA
    request; pass the adapter's path to reproduce its hashes.
    """
    keys: list[tuple[Any, ...]] = []
    if lora_name:
        keys.append(("lora", lora_name, lora_path))
    for span in mm_spans:
        if span.offset >= end_token_index:
            break
        if span.offset + span.length > start_token_index:
            keys.append(("mm", span.identifier, span.offset - start_token_index))
    if start_token_index == 0 and cache_salt:
        keys.append(("cache_salt", cache_salt))
    return tuple(keys) if keys else None


def request_block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    *,
    hash_seed: str | int | None = None,
    hash_algo: HashAlgo = "sha256_cbor",
    lora_name: str | None = None,
    lora_path: str = "",
    mm_spans: Sequence[MultiModalSpan] = (),
    cache_salt: str | None = None,
    known_hashes: Sequence[bytes] = (),
) -> list[bytes]:
    """Hashes of the *new* full blocks of a request (partial blocks are never hashed).

    ``known_hashes`` are the request's block hashes computed so far (vLLM's
    ``request.block_hashes``); hashing resumes after them, chained onto the last
    one.  Returns only the newly computed hashes, like vLLM's block hasher.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    _check_algo(hash_algo)
    start = len(known_hashes) * block_size
    parent: bytes | None = known_hashes[-1] if known_hashes else None
    new_hashes: list[bytes] = []
    while start + block_size <= len(token_ids):
        end = start + block_size
        extra = block_extra_keys(
            start,
            end,
            lora_name=lora_name,
            lora_path=lora_path,
            mm_spans=mm_spans,
            cache_salt=cache_salt,
        )
        parent = hash_block_tokens(
            parent, token_ids[start:end], extra, hash_seed=hash_seed, hash_algo=hash_algo
        )
        new_hashes.append(parent)
        start = end
    return new_hashes


def to_event_extra_keys(
    per_block_keys: Iterable[tuple[Any, ...] | None] | None,
) -> list[tuple[Any, ...] | None] | None:
    """Untag per-block extra keys for a ``BlockStored`` event, as vLLM 0.33 does.

    A multimodal key becomes ``(identifier, offset)``; every other key becomes
    its first payload value (a LoRA key publishes only the name).  A block with
    no keys stays ``None``; an empty input gives ``None``.
    """
    if per_block_keys is None:
        return None
    published: list[tuple[Any, ...] | None] = []
    for keys in per_block_keys:
        if keys is None:
            published.append(None)
        else:
            published.append(tuple(key[1:] if key[0] == "mm" else key[1] for key in keys))
    return published or None


def sglang_page_hash(prior_digest: bytes | None, page_token_ids: Sequence[int]) -> bytes:
    """SGLang's per-page digest: ``sha256(prior_digest || tokens as uint32 LE)``.

    ``prior_digest`` is the previous page's 32-byte digest, or ``None`` under
    the radix root.  Provided so SGLang event streams can be checked on import.
    """
    data = bytearray(prior_digest or b"")
    for token_id in page_token_ids:
        if isinstance(token_id, bool) or not 0 <= token_id < (1 << 32):
            raise ValueError(f"SGLang token ids must fit in uint32, got {token_id!r}")
        data += token_id.to_bytes(4, "little")
    return hashlib.sha256(bytes(data)).digest()


def sglang_event_hash(page_digest: bytes) -> int:
    """The id SGLang publishes for a page: its first 8 bytes as a signed int64."""
    return int.from_bytes(page_digest[:8], "big", signed=True)
