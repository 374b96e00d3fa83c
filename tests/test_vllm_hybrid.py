"""The worked vLLM 0.33 hybrid examples of ../shared/reference/hybrid.md section 2, as tests.

The scenario is ``../shared/peers/hybrid/vl_hybrid_demo.py``'s, driven here
through kvstate's hybrid ``KVCacheManager`` as vLLM's scheduler would:
request A (a 20-token prompt, block size 4) prefills, decodes seven tokens
and finishes; B resends A's prompt plus three of its outputs and two new
tokens; C shares 10 tokens (2.5 blocks); D resends A's prompt.  Every
number asserted (block ids per group, hits, junctions, chunk sizes, the
free queue, the events' groups, kinds, windows, hash counts and token
ranges) is the one vLLM 0.33 printed (``../shared/peers/hybrid/out/
vl_{swa,mamba}_{engine,dense}.txt``).  Every step also checks the core
invariants.
"""

from __future__ import annotations

from typing import Any

import pytest
from vllm_helpers import BS, FULL, MAMBA, SWA, hybrid_config

from kvstate.invariants import check
from kvstate.vllm import BlockStored, KVCacheManager, Request
from kvstate.vllm.hybrid import HybridKVCacheManager

PROMPT = list(range(100, 120))


def make(kind: str, retention: int | None, num_blocks: int = 40) -> HybridKVCacheManager:
    others = [SWA, SWA] if kind == "swa" else [MAMBA]
    config = hybrid_config(FULL, *others, num_blocks=num_blocks, retention=retention)
    manager = KVCacheManager(config, 256, BS, BS, max_in_flight_tokens=256,
                             enable_kv_cache_events=True)
    assert isinstance(manager, HybridKVCacheManager)
    return manager


class Driver:
    """vLLM's scheduler calls for one request at a time (a new step per chunk and per token)."""

    def __init__(self, manager: HybridKVCacheManager) -> None:
        self.manager = manager
        self.chunks: list[int] = []

    def tables(self, request: Request) -> list[list[int]]:
        return list(self.manager.get_block_ids(request.request_id))

    def admit(self, rid: str, prompt: list[int], first_output: int) -> tuple[Request, Any]:
        manager = self.manager
        manager.new_step_starts()
        request = Request(rid, prompt, BS)
        blocks, hit, junction = manager.get_computed_blocks(request)
        request.shared_prefix_boundary = junction
        lookup = (list(blocks.get_block_ids()), hit, junction)
        self.chunks = []
        count = manager.mamba_block_aligned_split(request, request.num_tokens - hit, hit)
        assert manager.allocate_slots(request, count, hit, blocks,
                                      full_sequence_must_fit=True) is not None
        request.num_computed_tokens = hit + count
        self.chunks.append(count)
        while request.num_computed_tokens < request.num_tokens:
            manager.new_step_starts()
            count = manager.mamba_block_aligned_split(
                request, request.num_tokens - request.num_computed_tokens)
            assert manager.allocate_slots(request, count) is not None
            request.num_computed_tokens += count
            self.chunks.append(count)
            assert check(manager.engine.state) == []
        request.append_output_token_ids(first_output)
        return request, lookup

    def decode(self, request: Request, tokens: list[int]) -> None:
        for token in tokens:
            self.manager.new_step_starts()
            assert self.manager.allocate_slots(request, 1) is not None
            request.num_computed_tokens += 1
            request.append_output_token_ids(token)

    def events(self) -> list[tuple[int | None, str | None, int | None, int, int, int]]:
        """(group, kind, window, hashes, first token, token count) per BlockStored."""
        out = []
        for event in self.manager.take_events():
            assert isinstance(event, BlockStored)
            out.append((event.group_idx, event.kv_cache_spec_kind,
                        event.kv_cache_spec_sliding_window, len(event.block_hashes),
                        event.token_ids[0], len(event.token_ids)))
        return out

    def free(self, request: Request) -> list[int]:
        self.manager.free(request)
        assert check(self.manager.engine.state) == []
        return self.manager.block_pool.free_block_ids()


def test_swa_engine_default_retention() -> None:
    drive = Driver(make("swa", 0))
    a, lookup = drive.admit("A", PROMPT, 900)
    assert lookup == ([[], [], []], 0, 0)
    assert drive.tables(a) == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]]
    full, sw1, sw2 = ("full_attention", None), ("sliding_window", 8), ("sliding_window", 8)
    # Sparse retention: each window group keeps only the 2 blocks ending at the replay boundary.
    assert drive.events() == [(0, *full, 5, 100, 20), (1, *sw1, 2, 100, 20), (2, *sw2, 2, 100, 20)]
    drive.decode(a, [901, 902, 903, 904, 905, 906, 907])
    assert drive.tables(a) == [[1, 2, 3, 4, 5, 12, 6], [0, 0, 0, 0, 10, 11, 16],
                               [0, 0, 0, 0, 15, 7, 17]]
    # Decode caches one full-attention block; the window groups emit events with no hash.
    assert drive.events() == [(0, *full, 1, 900, 4), (1, *sw1, 0, 900, 4), (2, *sw2, 0, 900, 4)]
    queue = drive.free(a)
    assert queue[:8] == [17, 7, 15, 16, 11, 10, 6, 18] and queue[-8:] == [9, 14, 12, 5, 4, 3, 2, 1]
    b, lookup = drive.admit("B", PROMPT + [900, 901, 902, 555, 556], 777)
    assert lookup == ([[1, 2, 3, 4], [0, 0, 8, 9], [0, 0, 13, 14]], 16, 20)
    assert drive.tables(b) == [[1, 2, 3, 4, 17, 7, 15], [0, 0, 8, 9, 16, 11, 10],
                               [0, 0, 13, 14, 6, 18, 19]]
    assert drive.events() == [(0, *full, 2, 116, 8), (1, *sw1, 2, 116, 8), (2, *sw2, 2, 116, 8)]
    queue = drive.free(b)
    assert queue[:3] == [19, 10, 15] and queue[-8:] == [11, 16, 9, 8, 18, 6, 14, 13]
    c, lookup = drive.admit("C", PROMPT[:10] + [1, 2, 3, 4, 5, 6], 778)
    assert lookup == ([[], [], []], 0, 8)  # the shared 2.5 blocks: a junction at 8, no hit
    assert drive.events() == [(0, *full, 4, 100, 16), (1, *sw1, 3, 100, 16), (2, *sw2, 3, 100, 16)]
    drive.free(c)
    d, lookup = drive.admit("D", PROMPT, 779)
    assert lookup == ([[1, 2, 3, 4], [0, 0, 8, 9], [0, 0, 13, 14]], 16, 0)
    assert drive.tables(d) == [[1, 2, 3, 4, 28], [0, 0, 8, 9, 24], [0, 0, 13, 14, 29]]
    queue = drive.free(d)
    assert queue[:3] == [29, 24, 30] and queue[-8:] == [4, 3, 2, 1, 9, 8, 14, 13]


def test_swa_dense_retention_hits_longer() -> None:
    """Headline fact 3: the KVCacheConfig default (None) caches densely, so B hits 20 tokens,
    where the engine default (0) gives 16."""
    drive = Driver(make("swa", None))
    a, _ = drive.admit("A", PROMPT, 900)
    assert [event[3] for event in drive.events()] == [5, 5, 5]
    drive.decode(a, [901, 902, 903, 904, 905, 906, 907])
    drive.free(a)
    _, lookup = drive.admit("B", PROMPT + [900, 901, 902, 555, 556], 777)
    assert lookup[1:] == (20, 0)


def test_mamba_engine_default_retention() -> None:
    drive = Driver(make("mamba", 0))
    full, mamba = ("full_attention", None), ("mamba", None)
    a, _ = drive.admit("A", PROMPT, 900)
    assert drive.chunks == [16, 4]  # the split stops at the prompt's last aligned block
    assert drive.tables(a) == [[1, 2, 3, 4, 6], [0, 0, 0, 5, 7]]
    # The state at 16 (the replay boundary) is cached, the one at 20 is not.
    assert drive.events() == [(0, *full, 4, 100, 16), (1, *mamba, 1, 100, 16),
                              (0, *full, 1, 116, 4), (1, *mamba, 0, 116, 4)]
    drive.decode(a, [901, 902, 903, 904, 905, 906, 907])
    assert drive.tables(a) == [[1, 2, 3, 4, 6, 8, 7], [0, 0, 0, 0, 0, 0, 10]]
    queue = drive.free(a)
    assert queue[:3] == [10, 7, 9] and queue[-8:] == [39, 5, 8, 6, 4, 3, 2, 1]
    drive.events()
    b, lookup = drive.admit("B", PROMPT + [900, 901, 902, 555, 556], 777)
    assert lookup == ([[1, 2, 3, 4], [0, 0, 0, 5]], 16, 20)
    assert drive.chunks == [4, 4, 1]  # the junction at 20 and the last aligned block at 24
    assert drive.tables(b) == [[1, 2, 3, 4, 10, 9, 12], [0, 0, 0, 0, 0, 11, 13]]
    assert [event[:4] for event in drive.events()] == [(0, *full, 1), (1, *mamba, 1),
                                                       (0, *full, 1), (1, *mamba, 1)]
    drive.free(b)
    c, lookup = drive.admit("C", PROMPT[:10] + [1, 2, 3, 4, 5, 6], 778)
    assert lookup == ([[], []], 0, 8) and drive.chunks == [8, 4, 4]
    assert drive.tables(c) == [[13, 12, 15, 17], [0, 0, 16, 18]]
    assert [event[3] for event in drive.events()] == [2, 1, 1, 1, 1, 0]
    drive.free(c)
    d, lookup = drive.admit("D", PROMPT, 779)
    assert lookup == ([[1, 2, 3, 4], [0, 0, 0, 5]], 16, 0) and drive.chunks == [4]
    assert drive.tables(d) == [[1, 2, 3, 4, 18], [0, 0, 0, 5, 19]]
    assert drive.free(d)[-8:] == [13, 16, 18, 4, 3, 2, 1, 5]


def test_mamba_dense_retention_caches_every_state() -> None:
    drive = Driver(make("mamba", None))
    drive.admit("A", PROMPT, 900)
    assert [event[3] for event in drive.events()] == [4, 1, 1, 1]  # the state at 20 too


@pytest.mark.parametrize("retention", [0, None])
def test_mamba_refuses_a_state_cached_in_the_same_step(retention: int | None) -> None:
    """A Mamba hit on a state another request cached in this step is refused (vLLM asks for
    more blocks than the pool has, so nothing changes); from the next step on it is taken."""
    manager = make("mamba", retention)
    manager.new_step_starts()
    d = Request("D", PROMPT[:12] + [9, 9], BS)
    assert manager.mamba_block_aligned_split(d, 14) == 12
    assert manager.allocate_slots(d, 12) is not None  # caches the state after 12 tokens
    e = Request("E", PROMPT[:12] + [6, 6, 6], BS)
    blocks, hit, _ = manager.get_computed_blocks(e)
    assert hit == 12 and list(blocks.get_block_ids())[1] == [0, 0, manager.get_block_ids("D")[1][2]]
    before = manager.engine.state.fingerprint()
    assert manager.allocate_slots(e, 3, hit, blocks, full_sequence_must_fit=True) is None
    assert manager.allocate_slots(e, 3, hit, blocks) is None
    assert manager.engine.state.fingerprint() == before
    manager.new_step_starts()
    assert manager.allocate_slots(e, 3, hit, blocks, full_sequence_must_fit=True) is not None
    assert check(manager.engine.state) == []
