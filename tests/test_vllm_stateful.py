"""Hypothesis state machine over the vLLM front end: core invariants and vLLM's own rules.

Random interleavings of admissions (with prefix hits), decode steps, frees,
``evict_blocks``, ``reset_prefix_cache`` and pool-level get/touch/free, on full
attention or a sliding window, with caching on or off.  After every step:
``kvstate.invariants.check`` is clean, and vLLM's rules (reference section
1.9) hold as observed through the public API.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvstate.errors import InvalidEvent
from kvstate.invariants import check
from kvstate.vllm.block_pool import KVCacheBlock
from kvstate.vllm.manager import KVCacheManager
from kvstate.vllm.request import Request

BS = 2
NUM_BLOCKS = 9


class VllmMachine(RuleBasedStateMachine):
    manager: KVCacheManager

    def __init__(self) -> None:
        super().__init__()
        self.requests: dict[str, Request] = {}
        self.pool_refs: list[KVCacheBlock] = []
        self.counter = 0

    @initialize(window=st.sampled_from([None, None, 3, 5]), caching=st.booleans())
    def start(self, window: int | None, caching: bool) -> None:
        self.manager = KVCacheManager(NUM_BLOCKS, BS, 64, enable_caching=caching,
                                      sliding_window=window, enable_kv_cache_events=True)

    @rule(prompt=st.lists(st.integers(0, 2), min_size=1, max_size=9), lookahead=st.integers(0, 2))
    def admit(self, prompt: list[int], lookahead: int) -> None:
        rid = f"r{self.counter}"
        self.counter += 1
        request = Request(rid, prompt, BS)
        blocks, hit, boundary = self.manager.get_computed_blocks(request)
        assert boundary == 0
        assert hit % BS == 0 and hit <= request.num_tokens - 1
        assert len(blocks.blocks[0]) * BS == hit
        before = self.manager.engine.state
        new = self.manager.allocate_slots(request, request.num_tokens - hit, hit, blocks,
                                          num_lookahead_tokens=lookahead)
        if new is None:
            if self.manager.sliding_window is None:
                assert self.manager.engine.state is before  # all or nothing
            return
        table = self.manager.get_block_ids(rid)[0]
        assert len(table) == -(-(request.num_tokens + lookahead) // BS)
        request.num_computed_tokens = request.num_tokens
        self.requests[rid] = request

    @precondition(lambda self: bool(self.requests))
    @rule(data=st.data(), token=st.integers(0, 2))
    def decode(self, data: Any, token: int) -> None:
        rid = data.draw(st.sampled_from(sorted(self.requests)))
        request = self.requests[rid]
        request.append_output_token_ids(token)
        if self.manager.allocate_slots(request, 1) is not None:
            request.num_computed_tokens += 1
        else:  # the scheduler would preempt it
            self.manager.free(self.requests.pop(rid))

    @precondition(lambda self: bool(self.requests))
    @rule(data=st.data())
    def free(self, data: Any) -> None:
        rid = data.draw(st.sampled_from(sorted(self.requests)))
        self.manager.free(self.requests.pop(rid))
        assert self.manager.get_block_ids(rid) == ([],)

    @rule(block_ids=st.sets(st.integers(0, NUM_BLOCKS - 1), max_size=3))
    def evict(self, block_ids: set[int]) -> None:
        self.manager.evict_blocks(block_ids)
        for block_id in block_ids:
            assert self.manager.block_pool.blocks[block_id].block_hash is None

    @rule()
    def reset(self) -> None:
        busy = self.manager.block_pool.get_num_free_blocks() != NUM_BLOCKS - 1
        assert self.manager.reset_prefix_cache() is (not busy)

    @rule(count=st.integers(0, 2))
    def pool_get(self, count: int) -> None:
        pool = self.manager.block_pool
        count = min(count, pool.get_num_free_blocks())
        got = pool.get_new_blocks(count)
        assert all(block.ref_cnt == 1 and block.block_hash is None for block in got)
        self.pool_refs.extend(got)

    @precondition(lambda self: bool(self.pool_refs))
    @rule()
    def pool_touch_and_release(self) -> None:
        pool = self.manager.block_pool
        block = self.pool_refs[0]
        pool.touch([block])
        with_dup = [block, block]
        try:
            pool.free_blocks(with_dup)
            raise AssertionError("a duplicate inside one free_blocks must be rejected")
        except InvalidEvent:
            pass
        pool.free_blocks(self.pool_refs)
        pool.free_blocks([block])
        self.pool_refs.clear()

    @invariant()
    def core_invariants_hold(self) -> None:
        if hasattr(self, "manager"):
            assert check(self.manager.engine.state) == []

    @invariant()
    def vllm_rules_hold(self) -> None:
        if not hasattr(self, "manager"):
            return
        pool = self.manager.block_pool
        free = pool.free_block_ids()
        assert len(free) == pool.get_num_free_blocks() == len(set(free))
        assert 0 not in free and pool.null_block.block_hash is None
        for block in pool.blocks[1:]:
            assert (block.ref_cnt == 0) == (block.block_id in free)
            if block.block_hash is not None:
                copies = pool.get_cached_block(block.block_hash[:-4], [0])
                assert copies is not None  # hash <=> map entry
        if not self.manager.enable_caching:
            assert len(self.manager.engine.state.page_node) == 0
        self.manager.take_events()


TestVllmMachine = VllmMachine.TestCase  # runs under the active hypothesis profile (conftest)
