"""A listener failing at a commit leaves the SGLang front ends in step with the engine.

The engine raises ``ListenerError`` after a batch's events were applied, so
whatever a call records on its own objects and on the requests (rows, locks,
cursors, Mamba slots, the FULL -> SWA mapping) must already follow those events.
Each run below drives a scheduler-like sequence twice, once with a listener that
fails at every third commit it sees (attached during the calls whose effects are
all recorded on the objects, and treated as done when it fails) and once without
it: the traces must be identical and the checks clean.  Calls whose result the
scheduler takes from their return value (``match_prefix``, ``lock``, the token
allocators' ``alloc``) run without it, as an error raised at the commit loses
that value; the last tests fail such calls one at a time and check what they
recorded.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import pytest

from kvstate.errors import ListenerError
from kvstate.events import Evict, MambaCopy, MambaEvict, SwaEvict, SwaFree
from kvstate.invariants import check
from kvstate.sglang import Req
from kvstate.sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from kvstate.sglang.hybrid_req import HybridCacheInitParams, HybridReq
from kvstate.sglang.mamba_pool import HybridReqToTokenPool
from kvstate.sglang.mamba_radix_cache import MambaCacheInitParams
from kvstate.sglang.mamba_req import MambaReq
from kvstate.sglang.mamba_scheduler import mamba_slots_needed, track_decode, track_extend
from kvstate.sglang.params import EvictParams, MatchPrefixParams, RadixKey
from kvstate.sglang.pool import ReqToTokenPool
from kvstate.sglang.swa_allocator import SWATokenToKVPoolAllocator
from kvstate.sglang.unified_radix_cache import UnifiedRadixCache
from tests.listener_helpers import FailingListener
from tests.sglang_helpers import build


class _Calls:
    """Runs a front-end call, with the failing listener attached during it when ``failing``;
    a ``ListenerError`` means the call's events were applied: the call counts as done."""

    def __init__(self, engine: Any, failing: bool) -> None:
        self.engine, self.failing = engine, failing
        self.listener = FailingListener(3)
        self.failures = 0

    def __call__(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.failing:
            return fn(*args, **kwargs)
        self.engine.subscribe(self.listener)
        try:
            return fn(*args, **kwargs)
        except ListenerError as failure:
            assert failure.listener is self.listener
            self.failures += 1
            return None
        finally:
            with contextlib.suppress(ValueError):  # the engine detached it when it failed
                self.engine.unsubscribe(self.listener)


def _node(node: Any) -> int | None:
    return None if node is None else node.id


def _both_runs(run: Any, *args: Any) -> None:
    failing, calls = run(*args, failing=True)
    plain, _ = run(*args, failing=False)
    assert calls.failures >= 10  # the failing listener did fail, at many kinds of call
    assert failing == plain


# -- RadixCache, ReqToTokenPool and the token / paged allocators -----------------------------
def _plain_run(page_size: int, *, failing: bool) -> tuple[list[Any], _Calls]:
    pool, allocator, cache = build(num_tokens=44 if page_size == 1 else 64, page_size=page_size,
                                   rows=6, width=64)
    engine = cache.engine
    call = _Calls(engine, failing)
    running: list[Req] = []
    done: list[Req] = []

    def make_room(tokens: int) -> bool:
        short = tokens - allocator.available_size()
        if short > 0:
            call(cache.evict, short)
        return bool(allocator.available_size() >= tokens)

    def admit(req: Req, token: int) -> bool:
        req.init_next_round_input()
        fill = req.fill_ids
        slots, node = cache.match_prefix(fill)
        req.prefix_indices, req.last_node, req.cache_protected_len = slots, node, len(slots)
        call(cache.inc_lock_ref, node)
        extend = len(fill) - len(slots)
        if not make_room(extend + page_size):
            call(cache.dec_lock_ref, node)
            return False
        row = pool.alloc(1)[0]
        req.req_pool_idx = row
        if len(slots):
            call(pool.write, (row, slice(0, len(slots))), slots)
        if page_size == 1:
            new = allocator.alloc(extend)
        else:
            last = int(slots[-1]) if len(slots) else -1
            new = allocator.alloc_extend([len(slots)], [len(fill)], [last], extend)
        call(pool.write, (row, slice(len(slots), len(fill))), new)
        req.output_ids.append(token)
        call(cache.cache_unfinished_req, req)
        return True

    def decode(req: Req, token: int) -> None:
        row = req.req_pool_idx
        position = len(req.origin_input_ids) + len(req.output_ids) - 1
        if not make_room(page_size):
            return
        if page_size == 1:
            slot = allocator.alloc(1)
        else:
            slot = allocator.alloc_decode([position + 1], [int(pool.req_to_token[row, position - 1])])
        call(pool.write, (row, slice(position, position + 1)), slot)
        req.output_ids.append(token)
        req.init_next_round_input()
        if token % 3 == 0:
            call(cache.cache_unfinished_req, req)
        elif token % 3 == 1:
            call(cache.checkpoint, req, up_to=position + 1)

    def finish(req: Req, index: int) -> None:
        if index % 3 == 0:  # 0.5.23's own sequence: checkpoint, free_kv_row, unlock, free
            allocated = engine.view.requests[req.req_pool_idx].allocated
            call(cache.checkpoint, req, up_to=allocated)
            call(cache.free_kv_row, req, [(req.cache_protected_len, allocated)])
            call(cache.unlock, req.lock)
            req.lock = None
            call(pool.free, req)
        else:
            call(cache.cache_finished_req, req, is_insert=index % 3 == 1)
        done.append(req)

    trace: list[Any] = []
    for index in range(36):
        admitted = None
        if index % 2 == 0 and len(running) < 3:
            req = Req(f"r{index}", [index % 3] * 8 + list(range(100 + index, 104 + index)))
            admitted = admit(req, 500 + index)
            if admitted:
                running.append(req)
        for other in running:
            decode(other, 600 + index)
        if len(running) == 3 or (running and admitted is False):
            finish(running.pop(0), index)
        view = engine.view
        trace.append((list(view.free_pages), list(view.free_rows), cache.evictable_size(),
                      cache.protected_size(),
                      [(r.rid, r.req_pool_idx, r.prefix_indices.tolist(), _node(r.last_node),
                        None if r.lock is None else _node(r.lock.node), r.cache_protected_len,
                        pool.req_to_token[r.req_pool_idx, :len(r.fill_ids)].tolist())
                       for r in running],
                      [(r.rid, r.req_pool_idx, None if r.lock is None else _node(r.lock.node))
                       for r in done]))
        assert check(view) == [] and pool.verify() == []
    assert any(isinstance(event, Evict) for event in engine.events)
    return trace, call


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_failing_listener_leaves_the_radix_cache_in_step(page_size: int) -> None:
    _both_runs(_plain_run, page_size)


# -- UnifiedRadixCache(FULL, SWA) and the Mamba trees ------------------------------------------
CONFIGS = {  # name: (SWA pool, Mamba pool, extra buffer)
    "swa": (True, False, False),
    "mamba-nobuf": (False, True, False),
    "mamba-extra": (False, True, True),
    "swa-mamba-nobuf": (True, True, False),
    "swa-mamba-extra": (True, True, True),
}


def _hybrid_objects(config: str, page_size: int) -> tuple[Any, Any, Any]:
    swa, mamba, extra = CONFIGS[config]
    if mamba:
        pool = HybridReqToTokenPool(size=4, mamba_size=16 if extra else 10, max_context_len=128,
                                    enable_mamba_extra_buffer=extra)
    else:
        pool = ReqToTokenPool(4, 128)
    full = 40 if page_size == 1 else 28 * page_size
    if swa:
        allocator: Any = SWATokenToKVPoolAllocator(full, 20 * page_size, page_size)
    else:
        allocator = (TokenToKVPoolAllocator(full) if page_size == 1
                     else PagedTokenToKVPoolAllocator(full, page_size))
    window = 2 * page_size + 1
    if not mamba:
        return pool, allocator, UnifiedRadixCache(HybridCacheInitParams(pool, allocator, page_size,
                                                                         window))
    components = ("FULL", "SWA", "MAMBA") if swa else ("FULL", "MAMBA")
    return pool, allocator, UnifiedRadixCache(MambaCacheInitParams(
        req_to_token_pool=pool, token_to_kv_pool_allocator=allocator, page_size=page_size,
        sliding_window_size=window if swa else None, tree_components=components,
        enable_mamba_extra_buffer=extra, mamba_chunk_size=4, mamba_track_interval=8))


def _hybrid_run(config: str, page_size: int, *, failing: bool) -> tuple[list[Any], _Calls]:
    swa, mamba, _ = CONFIGS[config]
    pool, allocator, cache = _hybrid_objects(config, page_size)
    engine = cache.engine
    call = _Calls(engine, failing)
    running: list[Any] = []
    done: list[Any] = []
    bare: list[Any] = []

    def allocated(req: Any) -> int:
        record = engine.view.requests.get(req.kv.req_pool_idx)
        return -1 if record is None else int(record.allocated)

    def undo(req: Any) -> bool:
        if mamba and req.kv.mamba_pool_idx is not None:
            call(pool.free_mamba_cache, req)
        if req.kv.req_pool_idx is not None:
            call(pool.free, req.kv)
        call(cache.unlock, req.lock)
        req.lock = None
        done.append(req)
        return False

    def admit(req: Any, token: int) -> bool:
        fill = req.full_untruncated_fill_ids
        try:
            found = cache.match_prefix(MatchPrefixParams(
                key=RadixKey(fill, limit=len(fill) - 1), cow_mamba=mamba, req=req))
        except MemoryError:
            return False
        req.prefix_len = found.device_prefix_len
        req.last_node = found.last_device_node
        req.swa_branching_seqlen = found.swa_branching_seqlen
        req.kv.cache_protected_len = req.prefix_len
        req.lock = cache.lock(req.last_node)
        if mamba:
            req.mamba_branching_seqlen = found.mamba_branching_seqlen
            needed = mamba_slots_needed(pool, [req])
            short = needed - pool.mamba_allocator.available_size()
            if short > 0:
                call(cache.evict_for_alloc, EvictParams(mamba_num=short))
            if pool.mamba_allocator.available_size() < needed:
                return undo(req)
            call(pool.alloc, [req])  # the row and the slots land on ``req.kv``
        else:
            req.kv.req_pool_idx = pool.alloc(1)[0]
        req.kv.kv_allocated_len = req.prefix_len
        call(cache.alloc_for_extend, req, len(fill), prefix_len=req.prefix_len)
        if allocated(req) != len(fill):
            return undo(req)
        req.kv.kv_allocated_len = req.kv.kv_committed_len = req.extend_end = len(fill)
        if mamba:
            track_extend(cache, req)
        req.output_ids.append(token)
        call(cache.checkpoint, req, up_to=req.extend_end)
        req.prefix_len = req.extend_end
        return True

    def decode(token: int) -> None:
        before = [allocated(req) for req in running]
        call(cache.alloc_for_decode, running, eviction_interval=2)
        for req, length in zip(running, before, strict=True):
            if allocated(req) != length + 1:
                break  # the step stopped here (out of memory)
            req.kv.kv_allocated_len += 1
            req.kv.kv_committed_len += 1
            req.output_ids.append(token)
            req.decode_batch_idx += 1
            if mamba:
                track_decode(cache, req)

    trace: list[Any] = []
    for index in range(40):
        tokens = [index % 3] * 8 + list(range(100 + index, 104 + index))
        if index % 6 == 0 and not bare:
            hit = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens[:8])))
            bare.append(cache.lock(hit.last_device_node))
            call(cache.release_swa, bare[-1])
        elif index % 6 == 3 and bare:
            call(cache.unlock, bare.pop())
        admitted = None
        if index % 2 == 0 and len(running) < 3:
            req = (MambaReq if mamba else HybridReq)(f"r{index}", tokens)
            admitted = admit(req, 500 + index)
            if admitted:
                running.append(req)
        if running:
            decode(600 + index)
        if swa and index % 4 == 1:
            for other in running:
                call(cache.evict_sliding_windows, other, other.seqlen - 1, eviction_interval=1)
        elif swa and index % 4 == 3:
            call(cache.maybe_evict_swa, running, eviction_interval=1)
        if index % 5 == 2:
            call(cache.evict, EvictParams(num_tokens=2 * page_size,
                                          swa_num_tokens=page_size * swa, mamba_num=int(mamba)))
        if len(running) == 3 or (running and admitted is False):
            req = running.pop(0)
            req.finished_reason = "abort" if index % 4 == 0 else "length"
            call(cache.release_kv_cache, req, checkpoint=index % 4 != 0)
            done.append(req)
        trace.append(_hybrid_snapshot(pool, allocator, cache, running, done, bare))
        assert check(engine.view) == [] and pool.verify() == []
        if swa:
            assert allocator.verify() == []
    kinds = {type(event) for event in engine.events}
    assert Evict in kinds and (not swa or {SwaFree, SwaEvict} <= kinds)
    assert not mamba or MambaEvict in kinds
    return trace, call


def _lock(lock: Any) -> Any:
    if lock is None:
        return None
    return (lock.receipt.node_id, dict(lock.receipt.component_lock_uuids), lock.swa_released,
            getattr(lock, "mamba_locked", None))


def _hybrid_snapshot(pool: Any, allocator: Any, cache: Any, running: list[Any], done: list[Any],
                     bare: list[Any]) -> Any:
    view = cache.engine.view
    mapping = getattr(allocator, "full_to_swa_index_mapping", None)
    requests = [(req.rid, dataclasses.asdict(req.kv), _lock(req.lock), _node(req.last_node),
                 req.prefix_len, req.swa_branching_seqlen, req.decode_batch_idx,
                 pool.req_to_token[req.kv.req_pool_idx, :req.kv.kv_allocated_len].tolist())
                for req in running]
    return (list(view.free_pages), list(view.free_rows), cache.total_size(),
            None if view.swa is None else list(view.swa.free_pages),
            None if view.mamba is None else list(view.mamba.free_slots),
            None if mapping is None else mapping.nonzero().flatten().tolist(),
            None if mapping is None else mapping[mapping.nonzero()].flatten().tolist(),
            requests, [(req.rid, dataclasses.asdict(req.kv), _lock(req.lock)) for req in done],
            [_lock(lock) for lock in bare])


@pytest.mark.parametrize(("config", "page_size"), [
    ("swa", 1), ("swa", 4), ("mamba-nobuf", 1), ("mamba-extra", 1), ("mamba-extra", 4),
    ("swa-mamba-nobuf", 1), ("swa-mamba-extra", 1), ("swa-mamba-extra", 4)])
def test_a_failing_listener_leaves_the_hybrid_trees_in_step(config: str, page_size: int) -> None:
    _both_runs(_hybrid_run, config, page_size)


# -- calls whose result is also returned ---------------------------------------------------
class _AlwaysFailing:
    def after(self, events: Any, view: Any) -> None:
        raise RuntimeError("listener failure")


def test_a_copy_on_match_failing_at_its_commit_leaves_the_slot_on_the_request() -> None:
    pool, _, cache = _hybrid_objects("mamba-nobuf", 1)
    tokens = list(range(1, 13))
    first = MambaReq("a", tokens)
    cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens, limit=11), cow_mamba=True,
                                         req=first))
    pool.alloc([first])
    cache.alloc_for_extend(first, len(tokens), prefix_len=0)
    first.kv.kv_allocated_len = first.kv.kv_committed_len = len(tokens)
    first.output_ids.append(99)
    first.finished_reason = "length"
    cache.release_kv_cache(first)  # the tree keeps its state at 12 tokens
    free = pool.mamba_allocator.available_size()
    second = MambaReq("b", tokens + [50, 51])
    cache.engine.subscribe(_AlwaysFailing())
    with pytest.raises(ListenerError):
        cache.match_prefix(MatchPrefixParams(key=RadixKey(second.origin_input_ids, limit=13),
                                             cow_mamba=True, req=second))
    copy = cache.engine.events[-1]
    assert isinstance(copy, MambaCopy)
    assert (second.kv.mamba_pool_idx, second.kv.mamba_cow_src_index) == (copy.dst, copy.src)
    cache.engine.subscribe(_AlwaysFailing())
    with pytest.raises(ListenerError):  # a slot taken before any row goes back
        cache.release_kv_cache(second, checkpoint=False)
    assert second.kv.mamba_pool_idx is None
    assert pool.mamba_allocator.available_size() == free and check(cache.engine.view) == []


def test_an_swa_allocation_failing_at_its_commit_still_maps_its_slots() -> None:
    _, allocator, _ = _hybrid_objects("swa", 4)
    allocator.engine.subscribe(_AlwaysFailing())
    pages = list(allocator.engine.view.free_pages)[:2]
    with pytest.raises(ListenerError):
        allocator.alloc(8)
    peer = allocator.engine.view.swa.peer
    slots = [page * 4 + k for page in pages for k in range(4)]
    assert allocator.full_to_swa_index_mapping[slots].tolist() == [
        peer[slot // 4] * 4 + slot % 4 for slot in slots]


def test_a_rolled_back_batch_leaves_nothing_for_the_swa_mapping_to_write() -> None:
    """A batch that frees SWA pages, or hands out slots, and then raises is undone: the
    mapping must not clear those pages or map those slots at the next commit."""
    _, allocator, _ = _hybrid_objects("swa", 4)
    engine = allocator.engine
    held = allocator.alloc(8).tolist()
    assert engine.state.seq == engine.seq  # freezes: the rollback starts from this state
    with pytest.raises(RuntimeError, match="undo"), engine.batch() as batch:
        batch.emit(SwaFree(tuple(sorted({slot // 4 for slot in held}))))
        allocator.map_slots(batch, [held[0]])
        raise RuntimeError("undo")
    assert engine.view.swa.peer and allocator.verify() == []
    allocator.alloc(4)  # the next commit
    assert allocator.verify() == []
    peer = engine.view.swa.peer
    assert allocator.full_to_swa_index_mapping[held].tolist() == [
        peer[slot // 4] * 4 + slot % 4 for slot in held]


def test_the_mamba_pool_calls_failing_at_their_commit_leave_the_request_in_step() -> None:
    pool, _, cache = _hybrid_objects("mamba-extra", 1)
    engine = cache.engine
    req = MambaReq("a", list(range(1, 9)))

    def failing(fn: Any, *args: Any) -> None:
        engine.subscribe(_AlwaysFailing())
        with pytest.raises(ListenerError):
            fn(*args)

    def slots() -> tuple[int, ...]:
        return (req.kv.mamba_pool_idx, *req.kv.mamba_ping_pong_track_buffer)

    failing(pool.alloc, [req])
    assert slots() == engine.view.mamba.rows[req.kv.req_pool_idx]
    failing(pool.donate_mamba_ping_pong_slot, req, pool.mamba_allocator.alloc(1))
    assert slots() == engine.view.mamba.rows[req.kv.req_pool_idx]
    failing(pool.free_mamba_cache, req)
    assert (req.kv.mamba_pool_idx, req.kv.mamba_ping_pong_track_buffer) == (None, None)
    assert req.kv.req_pool_idx not in engine.view.mamba.rows
    assert check(engine.view) == [] and pool.verify() == []
