"""shared/reference/hybrid.md's Mamba worked examples, on kvstate's front end.

The script is ``sg_mamba_demo.py``'s (a 20-token prompt A decoded 3 tokens,
then B sharing A's prompt and output, C sharing 10 tokens, a Mamba and a
FULL eviction) with 96 FULL slots, 10 Mamba slots and chunk 8: ``no_buffer``
at page 1, ``extra_buffer`` at page 4 (grid 8).  The expected values are
SGLang 0.5.23's (``out/sg_mamba_{no_buffer,extra_buffer}_python.txt``).
"""

from __future__ import annotations

import pytest

from kvstate.invariants import check
from kvstate.sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from kvstate.sglang.mamba_pool import HybridReqToTokenPool
from kvstate.sglang.mamba_radix_cache import MambaCacheInitParams
from kvstate.sglang.mamba_req import MambaReq
from kvstate.sglang.mamba_scheduler import admit, decode_step, finish, prefill_done
from kvstate.sglang.params import EvictParams, MatchPrefixParams, RadixKey
from kvstate.sglang.unified_radix_cache import UnifiedRadixCache
from kvstate.state import ROOT

PROMPT = list(range(100, 120))


def build(extra: bool):
    page = 4 if extra else 1
    pool = HybridReqToTokenPool(size=8, mamba_size=10, max_context_len=256,
                                enable_mamba_extra_buffer=extra)
    alloc = PagedTokenToKVPoolAllocator(96, page) if extra else TokenToKVPoolAllocator(96)
    cache = UnifiedRadixCache(MambaCacheInitParams(
        req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=page,
        tree_components=("FULL", "MAMBA"), enable_mamba_extra_buffer=extra, mamba_chunk_size=8))
    return cache, pool


def probe(cache, tokens):
    found = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens)))
    return found.device_prefix_len, found.full_kv_hit_length, found.mamba_branching_seqlen


def snapshot(cache):
    view = cache.engine.view
    assert check(view) == [] and cache.req_to_token_pool.verify() == []
    return (list(view.free_pages), list(view.mamba.free_slots),
            (cache.full_evictable_size(), cache.full_protected_size(),
             cache.mamba_evictable_size(), cache.mamba_protected_size()))


def states(cache):
    """Each node's root path end token and length, with its Mamba slot (None: none)."""
    view = cache.engine.view
    out = {}
    for node_id, node in view.nodes.items():
        if node_id == ROOT:
            continue
        record = view.mamba.nodes.get(node_id)
        out[(node.key[0], len(node.key))] = record.slot if record is not None else None
    return out


def run_script(extra: bool) -> dict:
    cache, pool = build(extra)
    seen: dict = {}
    a = MambaReq("A", PROMPT)
    admit(cache, a)
    seen["A ping-pong"] = a.kv.mamba_ping_pong_track_buffer
    prefill_done(cache, a, 900)
    seen["A after prefill"] = (a.kv.mamba_pool_idx, a.kv.mamba_ping_pong_track_buffer)
    seen["A prefill"] = snapshot(cache)
    for step in range(3):
        decode_step(cache, [a], 901 + step)
    finish(cache, a)
    seen["A finished"] = snapshot(cache)
    b = MambaReq("B", PROMPT + [900, 901, 555])
    seen["B probe"] = probe(cache, b.origin_input_ids)
    admit(cache, b)
    seen["B admitted"] = (b.prefix_len, b.kv.mamba_pool_idx, b.kv.mamba_cow_src_index)
    c = MambaReq("C", PROMPT[:10] + [1, 2, 3, 4, 5, 6])
    seen["C probe"] = probe(cache, c.origin_input_ids)
    admit(cache, c)
    seen["C admitted"] = (c.prefix_len, c.kv.mamba_pool_idx, c.mamba_branching_seqlen)
    for req, token in ((b, 1), (c, 2)):
        prefill_done(cache, req, token, finished=True)
        finish(cache, req)
    seen["B, C finished"] = snapshot(cache)
    seen["states"] = states(cache)
    seen["D probe"] = probe(cache, PROMPT[:10] + [1, 2, 3, 4, 5, 6, 9])
    result = cache.evict(EvictParams(mamba_num=1))
    seen["evict mamba"] = (result.num_tokens_evicted, result.mamba_num_evicted)
    seen["after evict mamba"] = snapshot(cache)
    result = cache.evict(EvictParams(num_tokens=4))
    seen["evict full"] = (result.num_tokens_evicted, result.mamba_num_evicted)
    seen["after evict full"] = snapshot(cache)
    return seen


@pytest.fixture(scope="module")
def no_buffer():
    return run_script(extra=False)


@pytest.fixture(scope="module")
def extra_buffer():
    return run_script(extra=True)


def test_no_buffer_prefill_donates_a_fork_and_keeps_the_running_state(no_buffer):
    assert no_buffer["A after prefill"] == (1, None)
    free, mamba, sizes = no_buffer["A prefill"]
    assert free == list(range(21, 97)) and mamba == [3, 4, 5, 6, 7, 8, 9, 10]
    assert sizes == (0, 20, 0, 1)
    free, mamba, sizes = no_buffer["A finished"]
    assert free[0] == 24 and mamba == [3, 4, 5, 6, 7, 8, 9, 10] and sizes == (23, 0, 2, 0)


def test_no_buffer_copy_on_match_and_branch_point(no_buffer):
    assert no_buffer["B probe"] == (20, 22, None)
    assert no_buffer["B admitted"] == (20, 3, 2)  # B got slot 3, copied from cached slot 2
    assert no_buffer["C probe"] == (0, 10, 8)
    assert no_buffer["C admitted"] == (0, 4, 8)
    free, mamba, sizes = no_buffer["B, C finished"]
    assert free == [*range(43, 97), 24, 25, *range(27, 37)]
    assert mamba == [5, 6, 7, 8, 9, 10] and sizes == (30, 0, 4, 0)
    assert no_buffer["states"] == {(100, 10): None, (110, 10): 2, (900, 2): None, (902, 1): 1,
                                   (555, 1): 3, (1, 6): 4}
    assert no_buffer["D probe"] == (16, 16, None)


def test_no_buffer_evictions(no_buffer):
    assert no_buffer["evict mamba"] == (1, 1)  # the least recent state, a leaf: deleted whole
    free, mamba, sizes = no_buffer["after evict mamba"]
    assert free[-1] == 23 and mamba == [5, 6, 7, 8, 9, 10, 1] and sizes == (29, 0, 3, 0)
    assert no_buffer["evict full"] == (13, 2)
    free, mamba, sizes = no_buffer["after evict full"]
    assert free[-14:] == [23, 26, 21, 22, *range(11, 21)]
    assert mamba == [5, 6, 7, 8, 9, 10, 1, 3, 2] and sizes == (16, 0, 1, 0)


def test_extra_buffer_donates_the_tracked_slot(extra_buffer):
    assert extra_buffer["A ping-pong"] == [2, 3]
    assert extra_buffer["A after prefill"] == (1, [4, 3])  # slot 2 went to the tree at 16
    free, mamba, sizes = extra_buffer["A prefill"]
    assert free == list(range(6, 25)) and mamba == [5, 6, 7, 8, 9, 10] and sizes == (0, 16, 0, 1)
    free, mamba, sizes = extra_buffer["A finished"]  # nothing more cached; slots 1, 4, 3 free
    assert free == list(range(5, 25)) and mamba == [5, 6, 7, 8, 9, 10, 1, 4, 3]
    assert sizes == (16, 0, 1, 0)


def test_extra_buffer_branch_checkpoint_and_evictions(extra_buffer):
    assert extra_buffer["B probe"] == (16, 16, None)
    assert extra_buffer["B admitted"] == (16, 5, 2)
    assert extra_buffer["C probe"] == (0, 8, 8)
    assert extra_buffer["C admitted"] == (0, 8, 8)
    free, mamba, sizes = extra_buffer["B, C finished"]
    assert free == [9, 10, 7, 8, 5, 6, *range(11, 25)]
    assert mamba == [1, 4, 3, 5, 6, 7, 8, 10] and sizes == (16, 0, 2, 0)
    assert extra_buffer["states"] == {(100, 8): 9, (108, 8): 2}  # C's state cached at 8
    assert extra_buffer["D probe"] == (8, 8, None)
    assert extra_buffer["evict mamba"] == (8, 1)  # a Mamba eviction of a leaf frees its FULL too
    free, mamba, sizes = extra_buffer["after evict mamba"]
    assert free[:2] == [3, 4] and mamba[-1] == 2 and sizes == (8, 0, 1, 0)
    assert extra_buffer["evict full"] == (8, 1)
    free, mamba, sizes = extra_buffer["after evict full"]
    assert free[:4] == [1, 2, 3, 4] and mamba[-2:] == [2, 9] and sizes == (0, 0, 0, 0)
