"""vLLM V1 front end for kvstate: byte-compatible block hashing and KV events.

Submodules (import them directly):

* :mod:`kvstate.vllm.cbor` -- minimal canonical CBOR encoder;
* :mod:`kvstate.vllm.hashing` -- ``sha256_cbor`` chained block hashes, ``NONE_HASH``;
* :mod:`kvstate.vllm.kv_events` -- ``BlockStored`` / ``BlockRemoved`` /
  ``AllBlocksCleared`` / ``KVEventBatch`` and their msgpack wire forms;
* :mod:`kvstate.vllm.zmq_events` -- ZMQ publisher with replay and a gap-filling
  subscriber (needs the optional ``pyzmq``; not imported here).
"""

from __future__ import annotations

from kvstate.vllm.hashing import (
    DEFAULT_NONE_HASH_SEED,
    HashAlgo,
    MultiModalSpan,
    block_extra_keys,
    external_block_hash,
    hash_block_tokens,
    none_hash,
    request_block_hashes,
    sha256_cbor,
    sha256_pickle,
    to_event_extra_keys,
)
from kvstate.vllm.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventDecodeError,
    decode_event_batch,
    encode_event_batch,
)

__all__ = [
    "DEFAULT_NONE_HASH_SEED",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KVEventBatch",
    "KVEventDecodeError",
    "HashAlgo",
    "MultiModalSpan",
    "block_extra_keys",
    "decode_event_batch",
    "encode_event_batch",
    "external_block_hash",
    "hash_block_tokens",
    "none_hash",
    "request_block_hashes",
    "sha256_cbor",
    "sha256_pickle",
    "to_event_extra_keys",
]
