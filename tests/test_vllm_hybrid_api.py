"""The hybrid front end's API: vLLM's constructor, KV-event bytes, logs, rejections, the split.

The byte string and the block ids below were printed by vLLM 0.33 for the same
calls (``PYTHONHASHSEED=0``, ``sha256_cbor``); tools/diff_vllm_hybrid.py
compares such sequences at random.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_helpers import BS, FULL, MAMBA, hybrid_config

from kvstate.engine import Engine
from kvstate.invariants import check
from kvstate.log import Recorder, read_events
from kvstate.replay import replay_path
from kvstate.state import Geometry
from kvstate.vllm import KVCacheManager, KVEventBatch, Request
from kvstate.vllm.events_bridge import NodeHashes
from kvstate.vllm.hashing import block_hash_with_group_id
from kvstate.vllm.hybrid import HybridKVCacheManager
from kvstate.vllm.kv_cache_interface import KVCacheConfig, MambaSpec, SlidingWindowSpec
from kvstate.vllm.kv_events import decode_event_batch, encode_event_batch


def swa(window: int = 8, size: int = BS) -> SlidingWindowSpec:
    return SlidingWindowSpec(block_size=size, num_kv_heads=1, head_size=8, dtype="float32",
                             sliding_window=window)


def config(*specs: object, num_blocks: int = 12, retention: int | None = 0) -> KVCacheConfig:
    return hybrid_config(*specs, num_blocks=num_blocks, retention=retention)


def three_groups(**options: object) -> HybridKVCacheManager:
    manager = KVCacheManager(config(FULL, swa(), MAMBA), 64, BS, BS, hash_seed="0",
                             enable_kv_cache_events=True, **options)  # type: ignore[call-overload]
    assert isinstance(manager, HybridKVCacheManager)
    return manager


def workload(manager: HybridKVCacheManager) -> None:
    """Prefill 8 + 2 tokens, free, then a 40-token prompt evicts a cached block (vLLM's run)."""
    a = Request("a", list(range(10)), BS, hash_seed="0")
    manager.new_step_starts()
    blocks, hit, _ = manager.get_computed_blocks(a)
    assert list(manager.allocate_slots(a, 8, hit, blocks).get_block_ids()) == [[1, 2], [3, 4], [0, 5]]  # type: ignore[union-attr]
    a.num_computed_tokens = 8
    manager.new_step_starts()
    assert list(manager.allocate_slots(a, 2).get_block_ids()) == [[6], [7], [8]]  # type: ignore[union-attr]
    a.num_computed_tokens = 10
    a.append_output_token_ids([7, 8])
    manager.free(a)
    b = Request("b", list(range(50, 90)), BS, hash_seed="0")
    manager.new_step_starts()
    blocks, hit, _ = manager.get_computed_blocks(b)
    new = manager.allocate_slots(b, 12, hit, blocks)
    assert new is not None and list(new.get_block_ids()) == [[8, 7, 6], [9, 10, 11], [0, 0, 2]]


VLLM_MAP_HEX = (  # vLLM 0.33's msgspec encoding of the events of ``workload``, ts=1.5, rank 0
    "93cb3ff800000000000097de000ba474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573"
    "92cf948a1fa5e8c9e91fcfd36d02ffac952d33b1706172656e745f626c6f636b5f68617368c0a9746f6b656e"
    "5f696473980001020304050607aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da34750"
    "55a96c6f72615f6e616d65c0aa65787472615f6b65797392c0c0a967726f75705f69647800b26b765f636163"
    "68655f737065635f6b696e64ae66756c6c5f617474656e74696f6ede000ca474797065ab426c6f636b53746f"
    "726564ac626c6f636b5f68617368657392cf948a1fa5e8c9e91fcfd36d02ffac952d33b1706172656e745f62"
    "6c6f636b5f68617368c0a9746f6b656e5f696473980001020304050607aa626c6f636b5f73697a6504a76c6f"
    "72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797392c0c0a967"
    "726f75705f69647801b26b765f63616368655f737065635f6b696e64ae736c6964696e675f77696e646f77bc"
    "6b765f63616368655f737065635f736c6964696e675f77696e646f7708de000ba474797065ab426c6f636b53"
    "746f726564ac626c6f636b5f68617368657391cfd36d02ffac952d33b1706172656e745f626c6f636b5f6861"
    "7368c0a9746f6b656e5f696473980001020304050607aa626c6f636b5f73697a6504a76c6f72615f6964c0a6"
    "6d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797391c0a967726f75705f696478"
    "02b26b765f63616368655f737065635f6b696e64a56d616d626184a474797065ac426c6f636b52656d6f7665"
    "64ac626c6f636b5f68617368657391cfd36d02ffac952d33a66d656469756da3475055a967726f75705f6964"
    "7800de000ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657393cf6d86a54608fcf0"
    "d8cf9f1301ed99e786ffcfdd294d94851ad50fb1706172656e745f626c6f636b5f68617368c0a9746f6b656e"
    "5f6964739c32333435363738393a3b3c3daa626c6f636b5f73697a6504a76c6f72615f6964c0a66d65646975"
    "6da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797393c0c0c0a967726f75705f69647800b26b"
    "765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6ede000ba474797065ab426c6f"
    "636b53746f726564ac626c6f636b5f68617368657390b1706172656e745f626c6f636b5f68617368c0a9746f"
    "6b656e5f6964739c32333435363738393a3b3c3daa626c6f636b5f73697a6504a76c6f72615f6964c0a66d65"
    "6469756da3475055a96c6f72615f6e616d65c0a967726f75705f69647801b26b765f63616368655f73706563"
    "5f6b696e64ae736c6964696e675f77696e646f77bc6b765f63616368655f737065635f736c6964696e675f77"
    "696e646f7708de000aa474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657390b1706172"
    "656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739c32333435363738393a3b3c3daa626c6f636b"
    "5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0a967726f75705f"
    "69647802b26b765f63616368655f737065635f6b696e64a56d616d626100"
)


def test_events_encode_to_vllm_bytes_in_both_forms() -> None:
    manager = three_groups()
    workload(manager)
    batch = KVEventBatch(1.5, manager.take_events(), 0)
    assert encode_event_batch(batch, "map").hex() == VLLM_MAP_HEX
    assert decode_event_batch(bytes.fromhex(VLLM_MAP_HEX)) == batch
    assert decode_event_batch(encode_event_batch(batch, "array")) == batch


def test_log_replays_and_events_derive_from_it(tmp_path: Path) -> None:
    manager = three_groups()
    path = tmp_path / "hybrid.kvlog"
    with Recorder(manager, str(path)):
        workload(manager)
        manager.evict_blocks({3, 4, 5, 8})
    result = replay_path(str(path))
    assert result.ok, result.failure
    assert result.state == manager.engine.state and check(result.state) == []
    live = manager.block_pool.take_events()  # the pool's events: no kind or window yet
    header, events = read_events(str(path))
    listener = NodeHashes(hash_seed="0", emit_events=True)
    engine = Engine(header.geometry)
    engine.subscribe(listener)
    for event in events:
        engine.apply(event)
    assert listener.take_events() == live
    assert {getattr(event, "group_idx", None) for event in live} == {0, 1, 2}


def test_block_hashes_carry_their_group() -> None:
    manager = three_groups()
    request = Request("a", list(range(10)), BS, hash_seed="0")
    manager.allocate_slots(request, 8)  # Mamba keeps a state only where a chunk ends
    request.num_computed_tokens = 8
    manager.allocate_slots(request, 2)
    pool = manager.block_pool
    tables = manager.get_block_ids("a")
    digest = request.block_hashes[1]
    for group in (0, 1, 2):
        block = pool.blocks[tables[group][1]]
        assert block.block_hash == block_hash_with_group_id(digest, group)
    assert [b.block_id for b in pool.get_cached_block(digest, [0, 1, 2]) or []] == \
        [tables[0][1], tables[1][1], tables[2][1]]
    assert pool.get_cached_block(request.block_hashes[0], [0, 2]) is None  # no state at 4
    with pytest.raises(ValueError, match="groups"):
        pool.get_cached_block(digest, [3])


def test_one_group_configs_build_the_one_group_manager() -> None:
    for spec, retention in ((FULL, 0), (FULL, None), (swa(), None)):
        manager = KVCacheManager(config(spec, retention=retention), 64, BS, BS)
        assert type(manager) is KVCacheManager
    for specs, retention in (((swa(),), 0), ((MAMBA,), None), ((FULL, FULL), None)):
        assert isinstance(KVCacheManager(config(*specs, retention=retention), 64, BS, BS),
                          HybridKVCacheManager)


@pytest.mark.parametrize(("in_flight", "admitted"), [(4, True), (64, False)])
def test_full_sequence_check_caps_a_sliding_window(in_flight: int, admitted: bool) -> None:
    """vLLM 0.33 admits a 40-token prompt into 5 free blocks only when the window's admission
    cap (window + in-flight tokens) is below them; a refusal commits nothing."""
    manager = KVCacheManager(config(swa(5), num_blocks=6, retention=None), 64, BS, BS,
                             max_in_flight_tokens=in_flight)
    request = Request("a", list(range(40)), BS)
    new = manager.allocate_slots(request, 8, full_sequence_must_fit=True)
    assert (new is not None) == admitted
    assert manager.block_pool.get_num_free_blocks() == (3 if admitted else 5)
    assert manager.engine.seq == (3 if admitted else 0)  # ReqAlloc, BlockAlloc, BlockCache


@pytest.mark.parametrize(("specs", "options", "message"), [
    ((FULL, swa(8, 8)), {}, "block size"),
    ((FULL, MambaSpec(block_size=BS, shapes=((1,),), dtypes=("f",))), {}, "align"),
    ((FULL, MambaSpec(block_size=BS, shapes=((1,),), dtypes=("f",), mamba_cache_mode="align",
                      num_speculative_blocks=1)), {}, "speculative"),
    ((FULL, swa()), {"use_eagle": True}, "use_eagle"),
    ((FULL, swa()), {"watermark": 0.1}, "watermark"),
])
def test_unmodelled_configurations_are_refused(specs: tuple[object, ...],
                                               options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KVCacheManager(config(*specs), 64, BS, BS, **options)  # type: ignore[call-overload]


def test_retention_is_validated_as_vllm_does() -> None:
    with pytest.raises(ValueError, match="multiple"):
        KVCacheManager(config(FULL, swa(), retention=6), 64, BS, BS)
    with pytest.raises(ValueError, match="no sliding-window or Mamba"):
        KVCacheManager(config(FULL, FULL, retention=8), 64, BS, BS)
    with pytest.raises(ValueError, match="scheduler_block_size"):
        KVCacheManager(config(FULL, swa()), 64, 8, BS)


def test_bad_hits_change_nothing() -> None:
    manager = three_groups()
    a = Request("a", list(range(12)), BS, hash_seed="0")
    manager.allocate_slots(a, 8)
    a.num_computed_tokens = 8
    manager.allocate_slots(a, 4)
    b = Request("b", list(range(12)) + [1], BS, hash_seed="0")
    blocks, hit, _ = manager.get_computed_blocks(b)
    assert hit == 8
    before = manager.engine.state.fingerprint()
    one_group = type(blocks)((blocks.blocks[0],))
    wrong_lengths = type(blocks)((blocks.blocks[0][:1], *blocks.blocks[1:]))
    for bad, count in ((one_group, hit), (wrong_lengths, hit), (blocks, hit - BS)):
        with pytest.raises(ValueError):
            manager.allocate_slots(b, 5, count, bad)
    with pytest.raises(ValueError, match="running"):
        manager.allocate_slots(a, 1, hit, blocks)
    with pytest.raises(ValueError, match="at most 4093"):  # "<id>/g2" must fit a core name
        manager.allocate_slots(Request("x" * 4096, [1], BS, hash_seed="0"), 1)
    assert manager.engine.state.fingerprint() == before


def test_mamba_split_follows_the_scheduler() -> None:
    manager = three_groups()
    request = Request("a", list(range(30)), BS)
    assert manager.mamba_block_aligned_split(request, 30) == 28  # the last aligned position
    assert manager.mamba_block_aligned_split(request, 10) == 8  # a mid-prompt chunk aligns down
    assert manager.mamba_block_aligned_split(request, 3) == 0  # ... to nothing at all
    assert manager.mamba_block_aligned_split(request, 3, max_prefill_tokens=3) == 3
    request.num_computed_tokens = 3
    assert manager.mamba_block_aligned_split(request, 20) == 1  # back onto a block boundary
    request.num_computed_tokens = 8
    request.shared_prefix_boundary = 14
    assert manager.mamba_block_aligned_split(request, 22) == 4  # the junction, block-floored
    request.append_output_token_ids(1)
    request.num_computed_tokens = 30
    assert manager.mamba_block_aligned_split(request, 1) == 1  # decode is not split
    only_windows = KVCacheManager(config(FULL, swa()), 64, BS, BS)
    assert only_windows.mamba_block_aligned_split(Request("b", list(range(30)), BS), 30) == 30  # type: ignore[attr-defined]


def test_public_steps_commit_what_allocate_slots_would() -> None:
    """``remove_skipped_blocks`` and ``cache_blocks`` called on their own commit the same
    events ``allocate_slots`` runs inside, and the predictor sees the same-step refusal."""
    manager = three_groups()
    a = Request("a", list(range(16)), BS, hash_seed="0")
    assert manager.allocate_slots(a, 12) is not None  # caches nothing yet past 12 tokens
    a.num_computed_tokens = 12
    before = manager.engine.seq
    manager.remove_skipped_blocks("a", 12)  # window 8: block 0 leaves; Mamba: states below 11
    tables = manager.get_block_ids("a")
    assert tables[1][0] == 0 and tables[2][:2] == [0, 0]
    manager.cache_blocks(a, 12)  # already cached up to 12: nothing new
    assert manager.engine.seq == before + 1  # one BlockRelease (the window block)
    b = Request("b", list(range(12)) + [5, 5], BS, hash_seed="0")
    blocks, hit, _ = manager.get_computed_blocks(b)
    assert hit == 12
    assert manager.get_num_blocks_to_allocate("b", 14, blocks, hit) > \
        manager.block_pool.num_gpu_blocks  # the state at 12 was cached in this step
    manager.new_step_starts()
    assert manager.get_num_blocks_to_allocate("b", 14, blocks, hit) <= 4
    assert check(manager.engine.state) == []


def test_both_backends_reach_the_same_state() -> None:
    """The planner's events are applied by the shared rules on either backend."""
    live = three_groups()
    workload(live)
    persistent = three_groups(engine=Engine(Geometry(num_pages=11, page_size=BS, row_width=68,
                                                     mode="block"), backend="persistent"))
    workload(persistent)
    assert persistent.engine.state.fingerprint() == live.engine.state.fingerprint()
    assert persistent.take_events() == live.take_events()
