"""The vLLM front end's fast paths give what their plain forms give.

* ``stored_event`` (``BlockStored`` from fields already in stored form) equals
  the converting constructor;
* ``hash_int_block`` (a request hashing its own checked tokens) equals
  ``hash_block_tokens``;
* the block rules' child key with a reused extra-keys ``repr`` equals
  ``block_child_key``; a ``BlockCache`` whose new positions are all masked
  leaves the same state as creating and pruning them (both backends);
* ``BlockPool.ids_of`` still refuses foreign views.
"""

from __future__ import annotations

import pytest

from kvstate.engine import Engine
from kvstate.events import BlockAlloc, BlockCache, ReqAlloc
from kvstate.rules.block_tree import _child_key
from kvstate.state import Geometry, block_child_key
from kvstate.vllm.block_pool import BlockPool
from kvstate.vllm.hashing import hash_block_tokens, hash_int_block, none_hash
from kvstate.vllm.kv_event_types import MEDIUM_GPU, BlockStored, stored_event
from kvstate.vllm.request import Request


def test_stored_event_equals_block_stored() -> None:
    built = stored_event((1, 2), 7, tuple(range(32)), 16, 3, "lora", (None, (("x", 1),)), 1,
                         "sliding_window", 128)
    plain = BlockStored([1, 2], 7, list(range(32)), 16, 3, MEDIUM_GPU, "lora",
                        [None, [("x", 1)]], 1, "sliding_window", 128)
    assert built == plain and hash(built) == hash(plain) and repr(built) == repr(plain)


@pytest.mark.parametrize("algo", ["sha256_cbor", "sha256"])
def test_hash_int_block_equals_hash_block_tokens(algo: str) -> None:
    parent = none_hash("0", algo)  # type: ignore[arg-type]
    for tokens, extra in (((1, 2, 3), None), ((70_000, 5), (("lora", "a", ""),))):
        assert hash_int_block(parent, tokens, extra, algo) == hash_block_tokens(  # type: ignore[arg-type]
            parent, tokens, extra, hash_algo=algo)  # type: ignore[arg-type]


def test_child_key_memo_equals_block_child_key() -> None:
    extra = (("group", 1),)
    for _ in range(3):  # the memo's hit and miss paths
        assert _child_key((1, 2), extra) == block_child_key((1, 2), extra)
    assert _child_key((1, 2), (("group", 1),)) == block_child_key((1, 2), (("group", 1),))
    assert _child_key((1, 2), (("x", True),)) == block_child_key((1, 2), (("x", True),))
    assert _child_key((1, 2), None) == block_child_key((1, 2), None)


@pytest.mark.parametrize("backend", ["live", "persistent"])
def test_masked_tail_cache_leaves_the_same_state(backend: str) -> None:
    geometry = Geometry(num_pages=8, page_size=2, row_width=16, mode="block")

    def run(masked_pages: tuple[int, int]) -> Engine:
        engine = Engine(geometry, backend=backend)
        engine.apply(ReqAlloc(("r",)))
        engine.apply(BlockAlloc("r", (1, 2, 3)))
        engine.apply(BlockCache(0, ((1, (1, 2), None, 1),)))
        # positions 1 and 2 under node 1, both masked (page 0): created and pruned at once
        engine.apply(BlockCache(1, ((2, (3, 4), None, masked_pages[0]),
                                    (3, (5, 6), None, masked_pages[1]))))
        return engine

    masked = run((0, 0))
    assert set(masked.view.nodes) == {0, 1}
    assert masked.view.next_node_id == 4
    assert masked.state.evictable_size == 2  # node 1 only
    fresh = Engine(geometry, backend=backend)
    fresh.apply(ReqAlloc(("r",)))
    fresh.apply(BlockAlloc("r", (1, 2, 3)))
    fresh.apply(BlockCache(0, ((1, (1, 2), None, 1),)))
    assert masked.state.nodes[1] == fresh.state.nodes[1]


def test_ids_of_refuses_foreign_views() -> None:
    pool = BlockPool(8, True, 2)
    other = BlockPool(8, True, 2)
    blocks = pool.get_new_blocks(2)
    assert pool.ids_of(blocks) == [block.block_id for block in blocks]
    assert pool.ids_of(iter([pool.null_block, *blocks])) == [block.block_id for block in blocks]
    assert pool.ids_of([pool.null_block], keep_null=True) == [0]
    with pytest.raises(TypeError):
        pool.ids_of([other.blocks[1]])
    with pytest.raises(TypeError):
        pool.ids_of([object()])  # type: ignore[list-item]


def test_group_chains_share_token_tuples() -> None:
    request = Request("r", list(range(40)), 16, hash_seed="0")
    chain = request.group_chain(1)
    assert list(chain.block_token_keys) == [tuple(range(16)), tuple(range(16, 32))]
    assert chain.block_keys[0] == block_child_key(tuple(range(16)), (("group", 1),))
    assert chain.block_extra_keys[0] is Request("s", [1] * 16, 16).group_chain(1).block_extra_keys[0]


@pytest.mark.parametrize("seed", range(8))
def test_one_group_idle_shortcut_changes_nothing(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-group manager's decode shortcut (``allocation_is_idle``) never changes what a
    call does: the differential's random scheduler sequences traced as shipped and with the
    shortcut off give the same results, free queue, ``ref_cnt``, tables and KV events."""
    import random

    import kvstate.vllm.manager as manager_module
    from tools.diff_vllm import kvstate_side, make_ops

    rng = random.Random(seed)
    config = {"seed": seed, "block_size": rng.choice([2, 4, 16]),
              "num_blocks": rng.choice([11, 24, 64]), "max_model_len": 4096,
              "enable_caching": seed % 4 != 3, "sliding_window": 0}
    ops = make_ops(seed, 150, vocab=6, block_size=config["block_size"])
    taken = []
    original = manager_module.allocation_is_idle

    def counted(*args: object, **kwargs: object) -> bool:
        idle = original(*args, **kwargs)  # type: ignore[arg-type]
        taken.append(idle)
        return idle

    monkeypatch.setattr(manager_module, "allocation_is_idle", counted)
    shipped, problems = kvstate_side(config, ops)
    assert problems == [] and any(taken)  # the shortcut was taken, and kept the invariants
    monkeypatch.setattr(manager_module, "allocation_is_idle", lambda *a, **k: False)
    planned, problems = kvstate_side(config, ops)
    assert problems == []
    assert shipped == planned
