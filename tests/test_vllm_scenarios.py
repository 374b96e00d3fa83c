"""Scenarios of ../shared/reference/vllm.md section 3, written from their descriptions.

Each test names its scenario number.  Where vLLM 0.33 differs from the
snapshot the reference describes, the 0.33 outcome is asserted (unhashed
freed blocks go to the head of the free queue; tagged extra keys; map-form
events; 3-value ``get_computed_blocks``).  The 0.33 numbers were confirmed
against real vLLM 0.33 with tools/diff_vllm.py.  Every scenario also checks
the core invariants after its calls.
"""

from __future__ import annotations

import hashlib

import pytest

from kvstate.invariants import check
from kvstate.planner.block_hits import window_hit
from kvstate.vllm.block_pool import BlockPool, KVCacheBlock
from kvstate.vllm.cbor import encode_canonical
from kvstate.vllm.hashing import (
    DEFAULT_NONE_HASH_SEED,
    MultiModalSpan,
    block_hash_with_group_id,
    external_block_hash,
    hash_block_tokens,
    none_hash,
    sha256_cbor,
)
from kvstate.vllm.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from kvstate.vllm.manager import KVCacheManager
from kvstate.vllm.request import Request
from tests.vllm_helpers import admit, ids

BS = 16


def make_manager(num_blocks: int = 11, block_size: int = BS, **options: object) -> KVCacheManager:
    return KVCacheManager(num_blocks, block_size, 8192, **options)  # type: ignore[arg-type]


def healthy(manager: KVCacheManager | BlockPool) -> None:
    engine = manager.engine
    assert check(engine.state) == []


def refs(pool: BlockPool, block_ids: list[int]) -> list[int]:
    return [pool.blocks[b].ref_cnt for b in block_ids]


# -- kv_cache_utils -----------------------------------------------------------------
def test_s01_none_hash_from_seed_or_fixed_default() -> None:
    assert none_hash("0") == sha256_cbor("0")
    assert none_hash(None) == sha256_cbor(DEFAULT_NONE_HASH_SEED)
    assert none_hash(None) != none_hash("0")
    assert Request("r", [1, 2], 2).block_hashes[0] == hash_block_tokens(none_hash(None), (1, 2))


def test_s02_block_ref_and_hash_life_cycle() -> None:
    manager = make_manager(4, 4)
    pool = manager.block_pool
    fresh = pool.blocks[1]
    assert (fresh.ref_cnt, fresh.block_hash) == (0, None)
    request = Request("a", [1, 2, 3, 4], 4)
    assert ids(admit(manager, request)[2]) == [1]
    assert fresh.ref_cnt == 1
    assert fresh.block_hash == block_hash_with_group_id(request.block_hashes[0], 0)
    pool.touch([fresh])
    assert fresh.ref_cnt == 2
    pool.free_blocks([fresh])
    manager.evict_blocks({1})
    assert (fresh.ref_cnt, fresh.block_hash) == (1, None)
    healthy(manager)


def test_s03_block_views_have_slots() -> None:
    block = BlockPool(3, True, 4).blocks[1]
    assert not hasattr(block, "__dict__")
    with pytest.raises(AttributeError):
        block.extra = 1  # type: ignore[attr-defined]


def test_s04_free_queue_pop_remove_append_and_empty() -> None:
    pool = BlockPool(6, True, 2)
    assert [b.block_id for b in pool.get_new_blocks(1)] == [1]
    assert pool.free_block_ids() == [2, 3, 4, 5]
    taken = pool.get_new_blocks(4)
    pool.free_blocks([taken[0], taken[1], taken[2]])  # uncached: to the head, in order
    assert pool.free_block_ids() == [2, 3, 4]
    pool.touch([pool.blocks[3]])  # remove from the middle relinks 2 and 4
    assert pool.free_block_ids() == [2, 4]
    pool.get_new_blocks(2)
    assert pool.get_num_free_blocks() == 0
    with pytest.raises(ValueError, match="Cannot get 1 free blocks from the pool"):
        pool.get_new_blocks(1)
    healthy(pool)


def test_s05_cached_blocks_append_at_tail_in_given_order() -> None:
    manager = make_manager(8, 2)
    pool = manager.block_pool
    request = Request("a", [1, 2, 3, 4, 5, 6], 2)
    assert ids(admit(manager, request)[2]) == [1, 2, 3]
    pool.touch([pool.blocks[1], pool.blocks[2], pool.blocks[3]])
    manager.free(request)  # the request's refs go; the pool still holds one each
    pool.free_blocks([pool.blocks[2], pool.blocks[3], pool.blocks[1]])
    assert pool.free_block_ids() == [4, 5, 6, 7, 2, 3, 1]
    healthy(manager)


def test_s06_pop_n_follows_an_arbitrary_queue_order() -> None:
    pool = BlockPool(7, True, 2)
    taken = pool.get_new_blocks(6)
    pool.free_blocks([taken[i] for i in (0, 2, 4, 3, 5, 1)])  # head order 1,3,5,4,6,2
    assert [b.block_id for b in pool.get_new_blocks(0)] == []
    assert [b.block_id for b in pool.get_new_blocks(1)] == [1]
    assert [b.block_id for b in pool.get_new_blocks(3)] == [3, 5, 4]
    assert pool.free_block_ids() == [6, 2]
    healthy(pool)


def test_s07_free_list_walk_reflects_each_operation() -> None:
    pool = BlockPool(5, True, 2)
    assert pool.free_block_ids() == [1, 2, 3, 4]
    first = pool.get_new_blocks(1)
    assert pool.free_block_ids() == [2, 3, 4]
    pool.touch([pool.blocks[3]])
    assert pool.free_block_ids() == [2, 4]
    pool.free_blocks(first)
    assert pool.free_block_ids() == [1, 2, 4]
    pool.free_blocks([pool.blocks[3]])
    assert pool.free_block_ids() == [3, 1, 2, 4]
    healthy(pool)


MM_SPANS = (MultiModalSpan("hash1", 0, 5), MultiModalSpan("hash1b", 10, 5))


def test_s08_multimodal_extra_keys_are_tagged_with_offsets() -> None:
    request = Request("mm", list(range(15)), 5, mm_spans=MM_SPANS)
    assert request.block_extra_keys == [(("mm", "hash1", 0),), None, (("mm", "hash1b", 0),)]
    wide = Request("mm2", list(range(15)), 15, mm_spans=MM_SPANS)
    assert wide.block_extra_keys == [(("mm", "hash1", 0), ("mm", "hash1b", 10))]
    shifted = Request("mm3", list(range(16)), 8, mm_spans=(MultiModalSpan("x", 3, 8),))
    assert shifted.block_extra_keys == [(("mm", "x", 3),), (("mm", "x", -5),)]


def test_s09_no_extra_inputs_give_none() -> None:
    assert Request("p", list(range(8)), 4).block_extra_keys == [None, None]


def test_s10_cache_salt_only_in_the_first_block_after_mm() -> None:
    request = Request("s", list(range(10)), 5, cache_salt="salt", mm_spans=MM_SPANS[:1])
    assert request.block_extra_keys == [(("mm", "hash1", 0), ("cache_salt", "salt")), None]


def test_s12_lora_key_is_name_and_path() -> None:
    request = Request("l", list(range(4)), 4, lora_name="test_lora_adapter", lora_path="/a")
    assert request.block_extra_keys == [(("lora", "test_lora_adapter", "/a"),)]
    assert Request("n", list(range(4)), 4).block_extra_keys == [None]


def test_s13_hash_block_tokens_is_sha256_of_the_cbor_triple() -> None:
    parent = b"\x01" * 32
    expected = hashlib.sha256(encode_canonical((parent, (1, 2, 3), ("k",)))).digest()
    assert hash_block_tokens(parent, [1, 2, 3], ("k",)) == expected


def test_s14_request_hashes_chain_and_skip_the_partial_tail() -> None:
    request = Request("h", [0, 1, 2, 3, 4, 5, 6], 3, hash_seed="0")
    root = none_hash("0")
    first = hash_block_tokens(root, (0, 1, 2))
    assert request.block_hashes == [first, hash_block_tokens(first, (3, 4, 5))]
    request.append_output_token_ids([7, 8])
    assert len(request.block_hashes) == 3


def test_s15_a_different_image_changes_every_downstream_hash() -> None:
    tokens = list(range(12))
    one = Request("a", tokens, 4, mm_spans=(MultiModalSpan("img-a", 0, 4),))
    two = Request("b", tokens, 4, mm_spans=(MultiModalSpan("img-b", 0, 4),))
    assert all(x != y for x, y in zip(one.block_hashes, two.block_hashes, strict=True))


def test_s17_lookahead_slots_are_allocated() -> None:
    for lookahead in (2, 4):
        manager = make_manager(10, 4)
        request = Request("la", [1, 2, 3], 4)
        new = manager.allocate_slots(request, 3, num_lookahead_tokens=lookahead)
        assert ids(new) == [1, 2]
        healthy(manager)


# -- prefix caching --------------------------------------------------------------------
COMMON = list(range(48))


def test_s19_prefill_with_033_free_queue_order() -> None:
    manager = make_manager()
    pool = manager.block_pool
    first = Request("0", COMMON + [3] * 7, BS)
    assert admit(manager, first)[:2] == ([], 0)
    assert manager.get_block_ids("0") == ([1, 2, 3, 4],)
    for index, block_id in enumerate((1, 2, 3)):
        block = pool.blocks[block_id]
        assert block.block_hash == block_hash_with_group_id(first.block_hashes[index], 0)
        assert block.ref_cnt == 1
    assert pool.blocks[4].block_hash is None
    second = Request("1", COMMON + [8] * 5, BS)
    hits, hit, new = admit(manager, second)
    assert (hits, hit, ids(new)) == ([1, 2, 3], 48, [5])
    assert refs(pool, [1, 2, 3]) == [2, 2, 2]
    assert pool.get_num_free_blocks() == 5
    manager.free(first)
    manager.free(second)
    assert pool.free_block_ids() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    third = Request("2", COMMON + [9] * 7, BS)
    hits, hit, new = admit(manager, third)
    assert (hits, hit, ids(new)) == ([1, 2, 3], 48, [5])
    assert pool.get_num_free_blocks() == 6
    manager.free(third)
    miss = Request("3", [7] * 160, BS)
    assert ids(admit(manager, miss)[2]) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    assert pool.free_block_ids() == []
    healthy(manager)


def test_s23_prompt_logprobs_request_caches_but_does_not_read() -> None:
    manager = make_manager()
    pool = manager.block_pool
    plain = Request("a", COMMON + [1], BS)
    admit(manager, plain)
    plp = Request("b", COMMON + [1], BS, skip_reading_prefix_cache=True)
    hits, hit, new = admit(manager, plp)
    assert (hits, hit, ids(new)) == ([], 0, [5, 6, 7, 8])
    assert [pool.blocks[b].block_hash for b in (1, 2, 3)] == \
        [pool.blocks[b].block_hash for b in (5, 6, 7)]
    assert refs(pool, [1, 2, 3, 5, 6, 7]) == [1] * 6
    healthy(manager)


def test_s24_decode_fills_the_partial_block_then_allocates_one() -> None:
    manager = make_manager()
    pool = manager.block_pool
    request = Request("d", COMMON + [5] * 7, BS)
    admit(manager, request)
    assert request.num_computed_tokens == 55
    request.append_output_token_ids([1, 2, 3, 4])
    assert ids(manager.allocate_slots(request, 4)) == []
    assert pool.blocks[4].block_hash is None
    request.num_computed_tokens = 59
    request.append_output_token_ids([6] * 19)
    assert ids(manager.allocate_slots(request, 19)) == [5]
    assert pool.blocks[4].block_hash is not None
    assert pool.blocks[5].block_hash is None
    healthy(manager)


def test_s25_evict_order_after_two_frees() -> None:
    manager = make_manager()
    pool = manager.block_pool
    big = Request("a", list(range(87)), BS)
    small = Request("b", list(range(100, 148)), BS)
    admit(manager, big)
    admit(manager, small)
    manager.free(big)
    manager.free(small)
    # 0.33: the unhashed partial block 6 goes to the head.
    assert pool.free_block_ids() == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]
    hits, hit, new = admit(manager, Request("c", list(range(35)), BS))
    assert (hits, hit, ids(new)) == ([1, 2], 32, [6])
    assert pool.get_num_free_blocks() == 7
    healthy(manager)


def test_s26_reused_block_is_evicted_on_reuse() -> None:
    manager = make_manager(2)
    pool = manager.block_pool
    first = Request("a", list(range(16)), BS)
    admit(manager, first)
    assert pool.blocks[1].block_hash is not None
    manager.free(first)
    assert ids(admit(manager, Request("b", list(range(50, 65)), BS))[2]) == [1]
    assert pool.blocks[1].block_hash is None
    healthy(manager)


def test_s27_computed_block_is_not_evicted_for_its_own_request() -> None:
    manager = make_manager(3, enable_kv_cache_events=True)
    one = Request("a", list(range(16)), BS)
    two = Request("b", list(range(100, 116)), BS)
    admit(manager, one)
    admit(manager, two)
    manager.free(one)
    manager.free(two)
    manager.take_events()
    hits, hit, new = admit(manager, Request("c", list(range(32)), BS))
    assert (hits, hit, ids(new)) == ([1], 16, [2])
    removed = manager.take_events()[0]
    assert removed == BlockRemoved([external_block_hash(two.block_hashes[0])], "GPU", 0)
    healthy(manager)


def test_s28_caching_disabled_never_hits_and_refuses_when_short() -> None:
    manager = make_manager(5, 4, enable_caching=False)
    pool = manager.block_pool
    first = Request("a", list(range(10)), 4)
    hits, hit, new = admit(manager, first)
    assert (hits, hit, ids(new)) == ([], 0, [1, 2, 3])
    manager.free(first)
    assert pool.free_block_ids() == [3, 2, 1, 4]  # caching off: every freed block to the head
    again = Request("b", list(range(10)), 4)
    hits, hit, new = admit(manager, again)
    assert (hits, hit, ids(new)) == ([], 0, [3, 2, 1])
    assert pool.free_block_ids() == [4]
    assert admit(manager, Request("c", list(range(10)), 4))[2] is None
    assert pool.blocks[3].block_hash is None
    healthy(manager)


def test_s29_cache_blocks_grows_the_cache() -> None:
    manager = make_manager(8, 4)
    request = Request("a", list(range(12)), 4)
    manager.allocate_slots(request, 12)
    pool = manager.block_pool
    cached = [b for b in range(1, 8) if pool.blocks[b].block_hash is not None]
    assert cached == [1, 2, 3]
    state = manager.engine.state
    assert len(state.page_node) == 3 and len(state.nodes) == 4
    healthy(manager)


def test_s30_multimodal_prefix_caching() -> None:
    spans = (MultiModalSpan("aaa", 11, 10), MultiModalSpan("bbb", 30, 10))
    manager = make_manager()
    first = Request("a", list(range(52)), BS, mm_spans=spans)
    assert first.block_extra_keys == [(("mm", "aaa", 11),), (("mm", "aaa", -5), ("mm", "bbb", 14)),
                                      (("mm", "bbb", -2),)]
    admit(manager, first)
    second = Request("b", list(range(52)), BS, mm_spans=spans)
    assert admit(manager, second)[:2] == ([1, 2, 3], 48)
    other = Request("c", list(range(52)), BS, mm_spans=(MultiModalSpan("zzz", 11, 10),))
    assert admit(manager, other)[:2] == ([], 0)
    healthy(manager)


def test_s31_cache_salt_isolates_the_chain() -> None:
    manager = make_manager(20)
    salted = Request("a", list(range(52)), BS, cache_salt="salt1")
    assert salted.block_extra_keys == [(("cache_salt", "salt1"),), None, None]
    admit(manager, salted)
    assert admit(manager, Request("b", list(range(52)), BS, cache_salt="salt1"))[:2] == \
        ([1, 2, 3], 48)
    assert admit(manager, Request("c", list(range(52)), BS, cache_salt="salt2"))[:2] == ([], 0)
    healthy(manager)


def test_s32_allocation_is_all_or_nothing_with_computed_blocks() -> None:
    manager = make_manager()
    pool = manager.block_pool
    keep = Request("keep", COMMON, BS)
    admit(manager, keep)
    longer = Request("long", list(range(96)), BS)
    assert admit(manager, longer)[:2] == ([1, 2, 3], 48)
    manager.free(longer)
    queue = pool.free_block_ids()
    assert queue == [7, 8, 9, 10, 6, 5, 4]
    too_big = Request("big", list(range(96)) + [1] * 66, BS)
    hits, hit, new = admit(manager, too_big)
    assert (hits, hit, new) == ([1, 2, 3, 4, 5, 6], 96, None)
    assert refs(pool, [1, 2, 3, 4, 5, 6]) == [1, 1, 1, 0, 0, 0]
    assert pool.free_block_ids() == queue
    assert manager.get_block_ids("big") == ([],)
    healthy(manager)


def test_s33_reset_prefix_cache_only_when_idle() -> None:
    manager = make_manager(enable_kv_cache_events=True)
    pool = manager.block_pool
    request = Request("a", COMMON + [1], BS)
    admit(manager, request)
    manager.take_events()
    assert manager.reset_prefix_cache() is False
    assert len(manager.engine.state.page_node) == 3
    manager.free(request)
    assert manager.reset_prefix_cache() is True
    assert all(pool.blocks[b].block_hash is None for b in range(11))
    assert manager.take_events() == [AllBlocksCleared()]
    assert admit(manager, Request("b", COMMON + [1], BS))[:2] == ([], 0)
    healthy(manager)


def test_s35_evicting_copies_one_by_one() -> None:
    manager = make_manager(6, 4)
    pool = manager.block_pool
    first = Request("a", list(range(12)), 4)
    admit(manager, first)  # blocks 1,2,3 = h0,h1,h2
    copy = Request("b", list(range(4)), 4, skip_reading_prefix_cache=True)
    admit(manager, copy)  # block 4 = a second copy of h0
    h0, h1, h2 = first.block_hashes

    def cached(digest: bytes) -> list[int] | None:
        found = pool.get_cached_block(digest, [0])
        return None if found is None else [b.block_id for b in found]

    assert (cached(h0), cached(h1), cached(h2)) == ([1], [2], [3])
    manager.evict_blocks({2})
    assert (cached(h0), cached(h1), cached(h2)) == ([1], None, [3])
    manager.evict_blocks({1})
    assert cached(h0) == [4]
    manager.evict_blocks({3})
    assert (cached(h0), cached(h2)) == ([4], None)
    manager.evict_blocks({4})
    assert cached(h0) is None
    assert len(manager.engine.state.nodes) == 1  # the tree is back to the root
    healthy(manager)


@pytest.mark.parametrize("num_blocks", [2, 3, 10])
def test_s36_kv_cache_events(num_blocks: int) -> None:
    manager = make_manager(num_blocks + 1, enable_kv_cache_events=True)
    first = Request("a", list(range(num_blocks * BS)), BS)
    admit(manager, first)
    events = manager.take_events()
    assert len(events) == 1 and isinstance(events[0], BlockStored)
    stored = events[0]
    assert len(stored.block_hashes) == num_blocks
    assert len(stored.token_ids) == num_blocks * BS
    assert stored.kv_cache_spec_kind == "full_attention"
    assert manager.take_events() == []
    manager.free(first)
    admit(manager, Request("b", list(range(1000, 1000 + num_blocks * BS)), BS))
    events = manager.take_events()
    assert [type(e) for e in events] == [BlockRemoved] * num_blocks + [BlockStored]
    assert {e.block_hashes[0] for e in events[:-1]} == set(stored.block_hashes)
    manager.free(Request("b", [1], BS))
    assert manager.reset_prefix_cache()
    assert manager.take_events() == [AllBlocksCleared()]
    assert len(manager.engine.state.page_node) == 0
    healthy(manager)


def test_s37_parent_hash_is_logical_under_a_null_block() -> None:
    manager = make_manager(12, 4, sliding_window=5, enable_kv_cache_events=True)
    first = Request("a", list(range(16)), 4)
    admit(manager, first)
    manager.free(first)
    manager.take_events()
    second = Request("b", list(range(24)), 4)
    hits, hit, new = admit(manager, second)
    assert (hits, hit) == ([0, 0, 0, 4], 16)
    assert manager.get_block_ids("b") == ([0, 0, 0, 4, 5, 6],)
    [stored] = manager.take_events()
    assert stored.parent_block_hash == external_block_hash(second.block_hashes[3])
    assert stored.kv_cache_spec_kind == "sliding_window"
    assert stored.kv_cache_spec_sliding_window == 5
    assert manager.block_pool.null_block.block_hash is None
    healthy(manager)


def test_s38_events_carry_lora_id_and_name() -> None:
    manager = make_manager(enable_kv_cache_events=True)
    admit(manager, Request("a", list(range(16)), BS, lora_name="ad", lora_path="/ad", lora_id=42))
    [stored] = manager.take_events()
    assert (stored.lora_id, stored.lora_name, stored.extra_keys) == (42, "ad", (("ad",),))
    admit(manager, Request("b", list(range(50, 66)), BS))
    [plain] = manager.take_events()
    assert (plain.lora_id, plain.lora_name, plain.extra_keys) == (None, None, (None,))


def test_s39_group_idx_and_spec_annotation() -> None:
    manager = make_manager(enable_kv_cache_events=True)
    request = Request("a", list(range(16)), BS)
    admit(manager, request)
    [stored] = manager.take_events()
    assert (stored.group_idx, stored.kv_cache_spec_kind, stored.kv_cache_spec_sliding_window) \
        == (0, "full_attention", None)
    manager.free(request)
    admit(manager, Request("b", list(range(70, 86)), BS))
    admit(manager, Request("c", list(range(90, 234)), BS))
    removed = [e for e in manager.take_events() if isinstance(e, BlockRemoved)]
    assert removed and all(e.group_idx == 0 for e in removed)
    pool_stored = BlockPool(4, True, 4, enable_kv_cache_events=True)
    blocks = pool_stored.get_new_blocks(1)
    pool_stored.cache_full_blocks(Request("p", [1, 2, 3, 4], 4), blocks, 0, 1, 4, 0)
    [raw] = pool_stored.take_events()
    assert (raw.group_idx, raw.kv_cache_spec_kind) == (0, None)  # annotation is the manager's


def test_s43_first_cached_copy_is_returned() -> None:
    manager = make_manager(8, 4)
    pool = manager.block_pool
    admit(manager, Request("a", list(range(5)), 4))  # block 1 = h
    dup = Request("b", list(range(5)), 4, skip_reading_prefix_cache=True)
    admit(manager, dup)  # block 3 = h again
    digest = dup.block_hashes[0]
    assert [b.block_id for b in pool.get_cached_block(digest, [0]) or []] == [1]
    manager.evict_blocks({5})  # not cached: a no-op
    manager.evict_blocks({1})
    assert [b.block_id for b in pool.get_cached_block(digest, [0]) or []] == [3]
    with pytest.raises(ValueError, match="only KV-cache group 0"):
        pool.get_cached_block(digest, [0, 1])
    healthy(manager)


# -- sliding window ---------------------------------------------------------------------
@pytest.mark.parametrize(("bitmap", "expected"), [
    ("TTFTFFTTFTTT", 12), ("TTFTFFTTFFF", 8), ("FTTT", 4), ("TFFF", 1), ("FFFF", 0)])
def test_s46_window_hit_scans_right_to_left(bitmap: str, expected: int) -> None:
    cached = [index + 1 if flag == "T" else 0 for index, flag in enumerate(bitmap)]  # 0: miss
    hit = window_hit(cached, window=4, block_size=2)
    assert len(hit) == expected
    if expected >= 2:
        assert hit[-2:] == [expected - 1, expected]
        assert all(b == 0 for b in hit[:-2])


def test_s47_remove_skipped_blocks_replaces_with_null() -> None:
    manager = make_manager(14, 2, sliding_window=4, enable_caching=False)
    pool = manager.block_pool
    request = Request("w", list(range(20)), 2)
    assert ids(manager.allocate_slots(request, 20)) == list(range(1, 11))
    manager.remove_skipped_blocks("w", 4)
    assert manager.get_block_ids("w")[0][:2] == [1, 2]
    manager.remove_skipped_blocks("w", 5)
    assert manager.get_block_ids("w")[0][:2] == [0, 2]
    manager.remove_skipped_blocks("w", 7)
    assert manager.get_block_ids("w")[0][:3] == [0, 0, 3]
    manager.remove_skipped_blocks("w", 11)
    assert manager.get_block_ids("w")[0][:5] == [0, 0, 0, 0, 5]
    assert pool.free_block_ids() == [4, 3, 2, 1, 11, 12, 13]
    healthy(manager)


def test_s48_predictor_counts_evictable_hits_not_nulls() -> None:
    manager = make_manager(30, 4)
    pool = manager.block_pool
    warm = Request("warm", list(range(40)), 4)
    admit(manager, warm)
    manager.free(warm)
    hits = [pool.blocks[b] for b in range(1, 11)]
    assert manager.get_num_blocks_to_allocate("x", 80, hits, 40) == 20
    padded = [pool.null_block] * 5 + hits[5:]
    assert manager.get_num_blocks_to_allocate("y", 80, padded, 40) == 15


def test_s49_evictable_hit_counted_once() -> None:
    manager = make_manager(6, 4)
    pool = manager.block_pool
    warm = Request("warm", list(range(4)), 4)
    admit(manager, warm)
    manager.free(warm)
    request = Request("r", list(range(8)), 4)
    blocks, hit, _ = manager.get_computed_blocks(request)
    assert hit == 4
    assert manager.get_num_blocks_to_allocate("r", 8, blocks.blocks[0], 4) == 2
    before = pool.get_num_free_blocks()
    new = manager.allocate_slots(request, 4, hit, blocks)
    assert len(ids(new) or []) == 1
    assert before - pool.get_num_free_blocks() == 2
    healthy(manager)


def test_s50_predictor_matches_allocator_across_chunks() -> None:
    manager = make_manager(40, 4, sliding_window=9)
    pool = manager.block_pool
    request = Request("c", list(range(100)), 4)
    computed = 0
    while computed < 100:
        chunk = min(30, 100 - computed)
        manager.remove_skipped_blocks("c", computed)
        predicted = manager.get_num_blocks_to_allocate("c", computed + chunk, (), computed)
        before = pool.get_num_free_blocks()
        assert manager.allocate_slots(request, chunk) is not None
        assert before - pool.get_num_free_blocks() == predicted
        computed += chunk
        request.num_computed_tokens = computed
    healthy(manager)


def test_s53_no_leak_after_every_request_finishes() -> None:
    manager = make_manager(12, 4)
    pool = manager.block_pool
    requests = [Request(f"r{i}", list(range(i, i + 10)), 4) for i in range(3)]
    for request in requests:
        admit(manager, request)
    for request in requests:
        manager.free(request)
    state = manager.engine.state
    assert pool.get_num_free_blocks() == 11 and not state.requests and not state.holders
    assert manager.running == {}
    assert len(state.page_node) > 0  # hashes stay (lazy eviction)
    healthy(manager)


def test_s56_same_step_prefill_dedup_and_next_turn() -> None:
    manager = make_manager(20)
    first = Request("a", list(range(40)), BS)
    second = Request("b", list(range(40)), BS)
    admit(manager, first)
    _, hit, _ = admit(manager, second)
    assert second.num_tokens - hit == 40 % BS
    assert first.num_computed_tokens == 40
    for token in range(9):  # decode steps: one slot per sampled token
        first.append_output_token_ids(token)
        assert manager.allocate_slots(first, 1) is not None
        first.num_computed_tokens += 1
    turn = Request("t", first.all_token_ids + [1, 2], BS)
    assert admit(manager, turn)[1] == (turn.num_tokens - 1) // BS * BS
    healthy(manager)


def test_s61_one_stored_event_for_a_two_block_prompt() -> None:
    manager = make_manager(enable_kv_cache_events=True)
    prompt = list(range(32))
    admit(manager, Request("e", prompt, BS))
    [stored] = manager.take_events()
    assert len(stored.block_hashes) == 2
    assert stored.parent_block_hash is None
    assert list(stored.token_ids) == prompt
    assert stored.group_idx == 0


def test_block_view_repr_and_kv_blocks() -> None:
    pool = BlockPool(3, True, 2)
    assert repr(pool.blocks[1]) == "KVCacheBlock(block_id=1, ref_cnt=0)"
    assert isinstance(pool.null_block, KVCacheBlock) and pool.null_block.is_null
