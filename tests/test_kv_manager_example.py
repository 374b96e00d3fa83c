"""Seed 002's Example section, verbatim (plus the invariants after it)."""

import pytest

import kvstate
from kvstate import ModelConfig, check
from kvstate.kv_manager import KVCacheManager


def test_seed_002_example_verbatim():
    config = ModelConfig(num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2)

    # Memory per token = 32 * 8 * 128 * 2 * 2 = 131,072 bytes = 128 KB
    bytes_per_token = 32 * 8 * 128 * 2 * 2
    assert bytes_per_token == 131072

    # 8 GB of GPU memory for KV-cache
    cache = KVCacheManager(config, max_gpu_memory_bytes=8 * 1024**3)

    # Maximum tokens = 8 GB / 128 KB = 65,536 tokens
    max_tokens = (8 * 1024**3) // 131072
    assert max_tokens == 65536

    # Allocate two requests
    assert cache.allocate("req1", prompt_tokens=1000, max_gen_tokens=500)   # reserves 1500 tokens
    assert cache.allocate("req2", prompt_tokens=2000, max_gen_tokens=1000)  # reserves 3000 tokens

    s = cache.stats()
    assert s["num_active_requests"] == 2
    assert s["used_memory_bytes"] == (1500 + 3000) * 131072

    # Free a request and reallocate
    cache.free("req1")
    s = cache.stats()
    assert s["num_active_requests"] == 1

    # Beyond the verbatim text: the manager's own numbers agree with the comments.
    assert cache.bytes_per_token == bytes_per_token and cache.max_tokens == max_tokens
    assert s["used_memory_bytes"] == 3000 * 131072
    assert check(cache.engine.state) == []


@pytest.mark.skipif(not hasattr(kvstate, "KVCacheManager"), reason="export not added yet")
def test_top_level_export_is_the_manager():
    assert kvstate.KVCacheManager is KVCacheManager
