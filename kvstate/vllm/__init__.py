"""vLLM V1 front end for kvstate: vLLM 0.33's block pool and KV-cache manager on the
block-mode core, byte-compatible block hashing and KV events.

Exported here: ``BlockPool``, ``KVCacheBlock``, ``KVCacheManager``,
``HybridKVCacheManager``, ``KVCacheBlocks``, ``PrefixCacheStats``,
``Request``, vLLM's configuration names (``KVCacheConfig``,
``KVCacheGroupSpec``, ``FullAttentionSpec``, ``SlidingWindowSpec``,
``MambaSpec``; see docs/vllm.md), and the hashing and event names below.
Every block decision is made by ``kvstate.planner.block`` (one group) and
``kvstate.planner.hybrid_vllm`` (several).  Submodules:

* :mod:`kvstate.vllm.block_pool`, :mod:`kvstate.vllm.manager`,
  :mod:`kvstate.vllm.hybrid`, :mod:`kvstate.vllm.request`,
  :mod:`kvstate.vllm.stats` -- the front end;
* :mod:`kvstate.vllm.kv_cache_interface`, :mod:`kvstate.vllm.manager_args`
  -- vLLM's configuration classes and constructor arguments;
* :mod:`kvstate.vllm.events_bridge` -- core block events -> vLLM KV events;
* :mod:`kvstate.vllm.importer` -- captured event streams -> core events;
* :mod:`kvstate.vllm.explore` -- a search level for the explorer;

* :mod:`kvstate.vllm.cbor` -- minimal canonical CBOR encoder;
* :mod:`kvstate.vllm.hashing` -- ``sha256_cbor`` chained block hashes, ``NONE_HASH``;
* :mod:`kvstate.vllm.kv_events` -- ``BlockStored`` / ``BlockRemoved`` /
  ``AllBlocksCleared`` / ``KVEventBatch`` and their msgpack wire forms;
* :mod:`kvstate.vllm.zmq_events` -- ZMQ publisher with replay
  (``zmq_publisher``) and a gap-filling subscriber (``zmq_subscriber``),
  re-exported together (needs the optional ``pyzmq``; not imported here).
"""

from __future__ import annotations

from kvstate.vllm.block_pool import BlockPool, KVCacheBlock
from kvstate.vllm.blocks import KVCacheBlocks
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
from kvstate.vllm.hybrid import HybridKVCacheManager
from kvstate.vllm.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
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
from kvstate.vllm.manager import KVCacheManager
from kvstate.vllm.request import Request
from kvstate.vllm.stats import PrefixCacheStats

__all__ = [
    "DEFAULT_NONE_HASH_SEED",
    "AllBlocksCleared",
    "BlockPool",
    "FullAttentionSpec",
    "HybridKVCacheManager",
    "KVCacheBlock",
    "KVCacheBlocks",
    "KVCacheConfig",
    "KVCacheGroupSpec",
    "KVCacheManager",
    "MambaSpec",
    "SlidingWindowSpec",
    "PrefixCacheStats",
    "Request",
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
