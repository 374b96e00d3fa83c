"""The executor's SWA layers (FULL + SWA hybrids): buffers per layer group, the full -> SWA
mapping, SWA plans and byte moves, integrity over request windows, exports, replay.

Driven by the real front end (``SWATokenToKVPoolAllocator``, ``UnifiedRadixCache`` and
``hybrid_scheduler``'s admit / prefill / decode / finish, plus the seeded op lists of
``tools/diff_sglang_hybrid.py``), with a canary per check: each corruption below must be
reported, and the same runs without it must pass.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kvstate import Engine, Geometry, ModelConfig
from kvstate.cli import main
from kvstate.events import (
    Allocate,
    Assign,
    Copy,
    FreeMapped,
    Insert,
    ReqAlloc,
    ReqFree,
    Reset,
    SwaAdopt,
    SwaAlloc,
    SwaEvict,
    SwaFree,
    SwaLock,
    SwaPublish,
    SwaRebind,
    SwaTouch,
)
from kvstate.executor import (
    SwaKVLost,
    SwaModelConfig,
    SwaTorchExecutor,
    TorchExecutor,
    UseAfterFree,
    enable_integrity,
    plan_indices,
    replay_hook,
    sglang_swa_req_to_token,
    swa_slots,
    swa_window_indices,
)
from kvstate.executor.index_plan import EMPTY_PLAN
from kvstate.log import Recorder, read_events
from kvstate.log.writer import write_log
from kvstate.sglang.hybrid_req import HybridCacheInitParams, HybridReq
from kvstate.sglang.hybrid_scheduler import admit, decode_step, finish, prefill_done
from kvstate.sglang.params import EvictParams
from kvstate.sglang.pool import ReqToTokenPool
from kvstate.sglang.swa_allocator import SWATokenToKVPoolAllocator
from kvstate.sglang.unified_radix_cache import UnifiedRadixCache
from kvstate.state import initial_state
from tools.diff_sglang_hybrid import FULL_PAGES, SWA_PAGES, generate
from tools.hybrid_ops import apply_op
from tools.hybrid_sides import Side

MODEL = ModelConfig(num_layers=3, num_kv_heads=1, head_dim=8)
WINDOW = 4
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))]


def hybrid(window: int | None = WINDOW) -> SwaModelConfig:
    return SwaModelConfig(MODEL, (0, 2), (1,), window)


def front_end(page_size=1, window=WINDOW, full=32, swa=24, device="cpu", register=True,
              integrity=True):
    """The SGLang front end on a shared engine, an SWA executor following it, integrity on."""
    pool = ReqToTokenPool(4, 128)
    alloc = SWATokenToKVPoolAllocator(full * page_size, swa * page_size, page_size)
    cache = UnifiedRadixCache(HybridCacheInitParams(pool, alloc, page_size, window))
    executor = SwaTorchExecutor(hybrid(window), full, page_size, swa, device=device,
                                poison_freed=True)
    executor.attach(cache.engine)
    if register:  # what SGLang's allocator does with its KV pool
        executor.register_mapping(alloc.full_to_swa_index_mapping)
    monitor = enable_integrity(executor, request_pool=pool) if integrity else None
    return SimpleNamespace(pool=pool, alloc=alloc, cache=cache, engine=cache.engine,
                           executor=executor, monitor=monitor)


def test_the_allocator_attaches_its_kvcache_and_shares_its_mapping():
    executor = SwaTorchExecutor(hybrid(WINDOW), 32, 1, 24, poison_freed=True)
    alloc = SWATokenToKVPoolAllocator(32, 24, 1, kvcache=executor)
    assert alloc.get_kvcache() is executor and executor.view is alloc.engine.view
    assert executor.full_to_swa_index_mapping is alloc.full_to_swa_index_mapping
    slots = alloc.alloc(3)
    assert executor.translate(slots.tolist()) == alloc.full_to_swa_index_mapping[slots].tolist()


def running(run, prompt=12, decodes=5, interval=1):
    """One request admitted, prefilled and decoded ``decodes`` tokens (out-of-window SWA freed)."""
    req = HybridReq(0, list(range(1, prompt + 1)))
    admit(run.cache, req)
    prefill_done(run.cache, req, 7)
    for _ in range(decodes):
        decode_step(run.cache, [req], 7, interval=interval)
    return req


def row_slots(run, req):
    return run.pool.req_to_token[req.kv.req_pool_idx, :req.kv.kv_allocated_len].tolist()


def seeded(seed, page_size, steps=120, executor=True, log=None):
    """A differential seed's ops on kvstate's front end, checked after every op."""
    window, interval, ops = generate(seed, steps, page_size)
    side = Side("kvstate", "-", page_size, window)
    engine = side.cache.engine
    recorder = Recorder(engine, log, checkpoint_every=32, fsync=False,
                        meta={"sliding_window_size": window}) if log else None
    monitor = None
    if executor:
        ex = SwaTorchExecutor(hybrid(window), FULL_PAGES, page_size, SWA_PAGES, device="cpu",
                              poison_freed=True)
        ex.attach(engine)
        ex.register_mapping(side.alloc.full_to_swa_index_mapping)
        monitor = enable_integrity(ex, request_pool=side.pool)
    for op in ops:
        apply_op(side, op, interval)
        if monitor is not None:
            report = monitor.check()
            assert report.ok, (op, str(report))
    if recorder is not None:
        recorder.close()
    return side, monitor, window


# -- configuration and buffers ----------------------------------------------------------
@pytest.mark.parametrize(("full", "swa", "window", "message"), [
    ((0, 1), (1, 2), 4, "both full and SWA"),
    ((0,), (1,), 4, "once each"),
    ((), (0, 1, 2), 4, "at least one"),
    ((0, 2), (1,), 0, "window"),
    ((0, 2), (1, 1), 4, "twice"),
    ((0, 2), ("1",), 4, "not a layer id"),
    ((0, 2), 1, 4, "sequence"),
])
def test_config_refuses_bad_layer_groups(full, swa, window, message):
    with pytest.raises(ValueError, match=message):
        SwaModelConfig(MODEL, full, swa, window)


def test_config_splits_the_model_into_two_pools():
    config = SwaModelConfig(MODEL, [2, 0], [1], 8)
    assert config.full_layers == (2, 0) and config.layers_mapping == {2: (0, False), 0: (1, False),
                                                                      1: (0, True)}
    assert config.full_config.num_layers == 2 and config.swa_config.num_layers == 1
    assert config.bytes_per_page(4) == (2 * 2 * 8 * 2 * 4, 1 * 2 * 8 * 2 * 4)


def test_each_group_has_its_own_pool_and_layer_ids_route_to_it():
    run = front_end(page_size=2, full=8, swa=6)
    ex = run.executor
    assert ex.layer_num == 2 and ex.swa_pool.layer_num == 1
    assert ex.k_buffer[0].shape == (9 * 2, 1, 8) and ex.swa_pool.k_buffer[0].shape == (7 * 2, 1, 8)
    assert ex.swa_nbytes == MODEL.bytes_per_token // 3 * 7 * 2
    slots = run.alloc.alloc(4)  # two FULL pages paired with two SWA pages
    swa = ex.translate(slots.tolist())
    assert swa == run.alloc.translate_loc_from_full_to_swa(slots).tolist() and 0 not in swa
    data = torch.arange(4 * 8, dtype=torch.float16).reshape(4, 1, 8)
    ex.set_layer_kv_buffer(1, slots, data, data + 1)  # model layer 1 is the SWA layer
    ex.set_layer_kv_buffer(SimpleNamespace(layer_id=2), slots, data + 2, data)
    k_swa, v_swa = ex.get_layer_kv_buffer(1)
    assert torch.equal(k_swa[swa], data) and torch.equal(v_swa[swa], data + 1)
    assert torch.equal(ex.get_layer_kv_buffer(2)[0][slots], data + 2)
    assert ex.get_layer_kv_buffer(0)[0] is ex.k_buffer[0]
    assert not ex.get_layer_kv_buffer(0)[0][slots].any()  # layer 0 was not written
    with pytest.raises(ValueError, match="model layer 3"):
        ex.get_layer_kv_buffer(3)
    with pytest.raises(ValueError, match="int64"):
        ex.register_mapping(torch.zeros(5, dtype=torch.int64))


def test_attach_needs_the_matching_swa_pool():
    executor = SwaTorchExecutor(hybrid(), 8, 1, 6, device="cpu")
    for engine, message in ((Engine(Geometry(num_pages=8)), "no SWA pool"),
                            (Engine(state=initial_state(Geometry(num_pages=8), swa_pages=5)),
                             "5 pages"),
                            (Engine(state=initial_state(Geometry(num_pages=9), swa_pages=6)),
                             "9 pages")):
        with pytest.raises(ValueError, match=message):
            executor.attach(engine)
    assert executor.engine is None  # nothing changed on a refusal
    with pytest.raises(TypeError):
        SwaTorchExecutor(MODEL, 8, 1, 6)  # type: ignore[arg-type]


def test_a_single_pool_executor_still_follows_a_hybrid_engine():
    """The existing executor mirrors the FULL pool of a hybrid state as before."""
    run = front_end()
    plain = TorchExecutor(ModelConfig(2, 1, 8), 32, 1, device="cpu", poison_freed=True)
    plain.attach(run.engine)
    monitor = enable_integrity(plain)
    req = running(run)
    finish(run.cache, req)
    assert monitor.swa is None and monitor.check().ok and monitor.verify().ok


# -- plans --------------------------------------------------------------------------------
def planned_state():
    """Row 1 holds FULL pages 1, 2 (paired with SWA 1, 2) and node 1 holds pages 3, 4 (SWA 3, 4)."""
    engine = Engine(state=initial_state(Geometry(num_pages=8, page_size=2, num_rows=2,
                                                 row_width=32), swa_pages=6))
    for event in (Allocate((1, 2, 3, 4)), SwaAlloc(((1, 1), (2, 2), (3, 3), (4, 4))),
                  ReqAlloc((1,)), Assign(1, 0, (2, 3, 4, 5)),
                  Insert(0, (9, 9, 9, 9), (6, 7, 8, 9), 1, 1)):
        engine.apply(event)
    return engine.state


def test_swa_events_plan_pairings_frees_and_moves():
    state = planned_state()
    assert plan_indices(state, SwaAlloc(((5, 5),))).swa_paired == ((5, 5),)
    freed = plan_indices(state, SwaFree((2, 1)))
    assert freed.swa_unpaired == (2, 1) and freed.swa_freed_slots == (4, 5, 2, 3)
    evicted = plan_indices(state, SwaEvict((1,)))
    assert evicted.swa_unpaired == (3, 4) and evicted.swa_freed_slots == (6, 7, 8, 9)
    assert plan_indices(state, Copy((1,), (2,))).swa_copy_dst == (4, 5)
    assert plan_indices(state, Reset("tree")).swa_unpaired == (3, 4)
    for event in (SwaTouch((1,), 2), SwaLock(1, 0, 0)):
        assert plan_indices(state, event) is EMPTY_PLAN
    tomb = Engine(state=state)
    tomb.apply(SwaEvict((1,)))
    after = tomb.state
    rebind = plan_indices(after, SwaRebind(1, (1, 2), 2))
    assert rebind.swa_moved == ((1, 3), (2, 4)) and rebind.swa_paired == ((3, 1), (4, 2))
    assert rebind.swa_unpaired == (1, 2) and rebind.swa_live_nodes == (1,)
    tomb.apply(ReqFree((1,)))
    adopt = plan_indices(tomb.state, SwaAdopt(1, (1, 2), 0, 2))
    assert adopt.freed_slots == (6, 7, 8, 9) and adopt.adopted[0][2] == (2, 3, 4, 5)
    assert plan_indices(after, SwaPublish(1, 2)).swa_live_nodes == (1,)
    assert set(plan_indices(tomb.state, Reset("all")).swa_unpaired) == {1, 2}


def test_index_planning_imports_no_torch():
    root = Path(__file__).resolve().parent.parent / "kvstate" / "executor"
    for name in ("index_plan", "plan", "plan_swa", "plan_tree", "plan_block", "plan_host",
                 "swa_config"):
        tree = ast.parse((root / f"{name}.py").read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                    if isinstance(node, ast.Import) for alias in node.names}
        imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom)}
        assert not imported & {"torch", "numpy"}, name


# -- byte moves ---------------------------------------------------------------------------
def test_swa_frees_poison_and_rebinds_remap_without_moving_bytes():
    run = front_end(page_size=2, full=8, swa=6, register=False, integrity=False)
    ex = run.executor
    slots = run.alloc.alloc(4).tolist()
    swa = ex.translate(slots)
    data = torch.ones(4, 1, 8, dtype=torch.float16)
    ex.set_layer_kv_buffer(1, slots, data, data)
    run.alloc.free_swa(slots[:2])  # the first page's SWA page goes back, poisoned
    assert torch.isnan(ex.swa_pool.k_buffer[0][swa[:2]]).all()
    assert ex.translate(slots) == [0, 0, *swa[2:]]
    assert torch.equal(ex.swa_pool.k_buffer[0][swa[2:]], data[2:])
    with run.engine.batch() as batch:  # both FULL pages copied: only the paired one has SWA
        batch.emit(Copy((slots[2] // 2,), (slots[0] // 2,)))
    assert torch.isnan(ex.swa_pool.k_buffer[0][swa[:2]]).all()
    before = ex.swa_pool.k_buffer[0].clone()
    run.engine.apply(Insert(0, (1, 2), tuple(slots[:2]), 1, 1))  # a tombstone: page unpaired
    run.engine.apply(SwaRebind(1, (slots[2] // 2,), 2))
    assert ex.translate(slots) == [*swa[2:], 0, 0]  # the tree's page reads the moved SWA page,
    assert torch.equal(ex.swa_pool.k_buffer[0].view(torch.int16), before.view(torch.int16))
    # and no byte moved (compared as bits: the poison is NaN)
    run.engine.apply(Reset("tree"))
    assert torch.isnan(ex.swa_pool.k_buffer[0][swa[2:]]).all()
    assert ex.translate(slots) == [0, 0, 0, 0]


# -- a decision in progress ----------------------------------------------------------------
def decision_engine(replayed=False):
    """Row 1 holds 2 tokens (pages 1, 2 paired with SWA pages 1, 2); an SWA executor follows."""
    engine = Engine(state=initial_state(Geometry(num_pages=8, num_rows=2, row_width=32),
                                        swa_pages=6))
    ex = SwaTorchExecutor(hybrid(), 8, 1, 6, device="cpu", poison_freed=True)
    ex.attach(engine)
    monitor = enable_integrity(ex, replayed=replayed)
    for event in (ReqAlloc((1,)), Allocate((1, 2)), SwaAlloc(((1, 1), (2, 2))),
                  Assign(1, 0, (1, 2))):
        engine.apply(event)
    assert monitor.check().ok
    return engine, ex, monitor


@pytest.mark.parametrize("replayed", [False, True])
def test_a_token_computed_before_its_page_is_paired_in_the_same_decision(replayed):
    """One decode decision allocates straight into the row, then pairs the page: the forward
    pass (after the decision) writes the SWA layers; a page never paired is a lost window."""
    engine, ex, monitor = decision_engine(replayed)
    step = (Allocate((3,), ((1, (3,)),)), SwaAlloc(((3, 3),)))
    if replayed:  # a log: one event per batch, a check between them
        for event in step:
            engine.apply(event)
            assert monitor.check().ok
    else:
        with engine.batch() as batch:
            for event in step:
                batch.emit(event)
    assert monitor.check().ok and monitor.verify().ok
    assert ex.translate([3]) == [3]
    engine.apply(Allocate((4,), ((1, (4,)),)))  # a decision that never pairs the page
    if replayed:
        assert monitor.check().ok  # the pairing may still come
        engine.apply(ReqAlloc((2,)))  # another event: the decision is over
    report = str(monitor.check())
    assert "SWA window lost: request 1 position 3" in report


def test_a_live_front_ends_mapping_is_read_after_its_decision():
    """Through a registered mapping (filled by the front end after its decision) the SWA
    writes wait for the next batch or check; a mapping still wrong then is reported."""
    engine, ex, monitor = decision_engine()
    mapping = ex.full_to_swa_index_mapping.clone()
    ex.register_mapping(mapping)
    with engine.batch() as batch:
        batch.emit(Allocate((3,), ((1, (3,)),)))
        batch.emit(SwaAlloc(((3, 3),)))
    assert monitor.swa.awaiting  # the mapping has no entry for slot 3 yet
    mapping[3] = 3  # the front end fills it
    engine.apply(ReqAlloc((2,)))  # the next batch: the forward pass ran before it
    assert not monitor.swa.awaiting and monitor.check().ok and monitor.verify().ok
    with engine.batch() as batch:
        batch.emit(Allocate((4,), ((1, (4,)),)))
        batch.emit(SwaAlloc(((4, 4),)))
    mapping[4] = 2  # a front-end bug: the slot maps another token's SWA slot
    report = str(monitor.check())
    assert "full_to_swa_index_mapping sends FULL slot 4 to SWA slot 2; the pairing says 4" \
        in report


# -- integrity over real front-end runs ----------------------------------------------------
@pytest.mark.parametrize("page_size", [1, 4])
def test_scheduler_flows_pass_every_check_and_windows_slide(page_size):
    run = front_end(page_size=page_size, full=40, swa=28)
    first = running(run, prompt=3 * page_size + 2, decodes=3 * page_size + 1)
    assert run.monitor.check().ok
    second = HybridReq(1, list(range(1, 3 * page_size + 1)) + [50, 51])  # a prefix hit
    admit(run.cache, second)
    prefill_done(run.cache, second, 9)
    for _ in range(2 * page_size + 3):
        decode_step(run.cache, [first, second], 7, interval=1)
        assert run.monitor.check().ok
    peer, size = run.engine.view.swa.peer, page_size
    slots = row_slots(run, first)
    gone = [p for p, s in enumerate(slots) if s // size not in peer]
    assert gone and max(gone) < len(slots) - WINDOW  # SWA before the window is gone, unreported
    assert all(s // size in peer for s in slots[-WINDOW:])
    finish(run.cache, first)
    finish(run.cache, second)
    assert run.monitor.check().ok and run.monitor.verify().ok
    kinds = Counter(type(e).__name__ for e in run.engine.events)
    assert kinds["SwaFree"] and kinds["SwaAlloc"]


def test_seeded_runs_cover_tombstones_recovery_and_eviction():
    kinds: Counter[str] = Counter()
    for seed, page_size in ((1, 1), (3, 4)):
        side, monitor, _ = seeded(seed, page_size)
        assert monitor.verify().ok
        kinds.update(type(e).__name__ for e in side.cache.engine.events)
    for kind in ("SwaFree", "SwaEvict", "SwaAdopt", "SwaRebind", "Evict", "FreeMapped"):
        assert kinds[kind], kind


def test_attaching_mid_run_tags_what_the_state_pairs():
    side, _, window = seeded(2, 4, steps=60, executor=False)
    ex = SwaTorchExecutor(hybrid(window), FULL_PAGES, 4, SWA_PAGES, device="cpu",
                          poison_freed=True)
    ex.attach(side.cache.engine)
    monitor = enable_integrity(ex)
    assert side.cache.engine.view.swa.peer and monitor.verify().ok
    for req in list(side.running):
        decode_step(side.cache, [req], 3, interval=1)
        finish(side.cache, req)
    assert monitor.check().ok and monitor.verify().ok


# -- canaries -------------------------------------------------------------------------------
@pytest.mark.parametrize("shift", [1, 10**6])
def test_canary_a_mapping_that_sends_a_write_elsewhere(shift):
    run = front_end()
    req = running(run, decodes=1)
    mirror = run.alloc._mirror
    real = mirror.hand_out

    def shifted(slots, view):  # a front-end bug: each slot mapped to another SWA slot
        real(slots, view)
        index = torch.tensor(list(slots), dtype=torch.int64)
        mirror.tensor[index] += shift

    mirror.hand_out = shifted
    decode_step(run.cache, [req], 7, interval=1)
    report = run.monitor.check()
    assert not report.ok and "full_to_swa_index_mapping sends FULL slot" in str(report)
    assert "SWA layer 1" in str(report)  # the token's SWA slot holds no tag of it


def test_canary_a_mapping_corrupted_after_the_write():
    run = front_end()
    req = running(run, decodes=2)
    assert run.monitor.check().ok  # the last decode's forward pass ran (its SWA writes landed)
    slots = row_slots(run, req)
    mapping = run.alloc.full_to_swa_index_mapping
    mapping[slots[-1]] = mapping[slots[-2]]
    assert run.monitor.check().ok  # no event moved anything: only a full read finds it
    report = run.monitor.verify()
    assert "via sglang_swa_req_to_token (full_to_swa_index_mapping)" in str(report)
    assert "via swa_window_indices" in str(report) and "(state pairing)" not in str(report)


def test_canary_a_freed_page_inside_the_window():
    run = front_end()
    req = running(run)
    slots = row_slots(run, req)
    run.alloc.free_swa([slots[-2]])  # SWA of the second-to-last position: inside the window
    report = run.monitor.check()
    assert f"SWA window lost: request {req.kv.req_pool_idx} position {len(slots) - 2}" in \
        str(report)
    assert not run.monitor.verify().ok
    with pytest.raises(SwaKVLost):
        swa_window_indices(run.engine.view, [req.kv.req_pool_idx], WINDOW)


def test_a_freed_page_before_the_window_is_not_reported():
    run = front_end()
    req = running(run, decodes=6, interval=128)  # nothing freed by the scheduler yet
    slots = row_slots(run, req)
    own = [s for p, s in enumerate(slots) if req.kv.cache_protected_len <= p < len(slots) - WINDOW]
    assert own
    run.alloc.free_swa(own[:1])
    assert run.monitor.check().ok and run.monitor.verify().ok


def test_canary_an_evicted_node_inside_the_window():
    run = front_end()
    req = running(run, decodes=0)  # the window is the tree's: the prefill checkpoint locked it
    run.cache.release_swa(req.lock)  # a bug: the window lock goes early
    evicted = run.cache.evict(EvictParams(swa_num_tokens=64))
    assert evicted.swa_num_tokens_evicted
    report = run.monitor.check()
    assert "SWA window lost" in str(report)


def rebind_engine():
    """Node 1 (tokens 5 6 7) is an SWA tombstone; row 2 computed the same tokens on pages 4-6."""
    engine = Engine(state=initial_state(Geometry(num_pages=16, num_rows=4, row_width=64),
                                        swa_pages=12))
    executor = SwaTorchExecutor(SwaModelConfig(ModelConfig(2, 1, 8), (0,), (1,), 4), 16, 1, 12,
                                device="cpu", poison_freed=True)
    executor.attach(engine)
    monitor = enable_integrity(executor)
    for event in (ReqAlloc((1,)), Allocate((1, 2, 3)), SwaAlloc(((1, 1), (2, 2), (3, 3))),
                  Assign(1, 0, (1, 2, 3)), Insert(0, (5, 6, 7), (1, 2, 3), 1, 1, 1),
                  ReqFree((1,)), SwaEvict((1,)), ReqAlloc((2,)), Allocate((4, 5, 6)),
                  SwaAlloc(((4, 4), (5, 5), (6, 6))), Assign(2, 0, (4, 5, 6))):
        engine.apply(event)
    return engine, monitor


@pytest.mark.parametrize("pages", [(4, 5, 6), (5, 4, 6)])
def test_canary_a_rebind_onto_bytes_of_other_positions(pages):
    engine, monitor = rebind_engine()
    assert monitor.check().ok
    with engine.batch() as batch:  # the recovery as the insert plans it: rebind, free, rewrite
        batch.emit(SwaRebind(1, pages, 2))
        batch.emit(FreeMapped((4, 5, 6)))
        batch.emit(Assign(2, 0, (1, 2, 3)))
    report = monitor.check()
    if pages == (4, 5, 6):
        assert report.ok and monitor.verify().ok, str(report)
    else:
        assert "tree node 1 token 0 (position 0): its SWA slot holds no KV computed for it " \
               "(position 1)" in str(report)


def test_a_rebind_left_half_done_loses_the_window():
    engine, monitor = rebind_engine()
    engine.apply(SwaRebind(1, (4, 5, 6), 2))  # the row keeps reading its moved-away SWA
    assert "SWA window lost: request 2 position 0" in str(monitor.check())


def test_canary_tokens_computed_on_a_page_without_swa():
    """A row written before its pages were paired: the SWA layers had nowhere to write."""
    engine = Engine(state=initial_state(Geometry(num_pages=8, num_rows=2, row_width=16),
                                        swa_pages=6))
    executor = SwaTorchExecutor(SwaModelConfig(ModelConfig(2, 1, 8), (0,), (1,), 2), 8, 1, 6,
                                device="cpu", poison_freed=True)
    executor.attach(engine)
    monitor = enable_integrity(executor)
    for event in (ReqAlloc((1,)), Allocate((1, 2)), Assign(1, 0, (1, 2))):
        engine.apply(event)
    report = monitor.check()
    assert "SWA window lost: request 1 position 0" in str(report)
    engine.apply(SwaAlloc(((1, 1), (2, 2))))  # paired afterwards: still no KV in there
    assert "the SWA slot of FULL slot 1 holds no KV computed for it (nothing)" in \
        str(monitor.check())


def test_canary_a_kernel_overwriting_window_bytes():
    run = front_end()
    req = running(run)
    assert run.monitor.check().ok  # the last decode's forward pass ran (its SWA writes landed)
    swa_slot = run.executor.translate(row_slots(run, req)[-1:])[0]
    run.executor.swa_pool.k_buffer[0][swa_slot] = 3.0
    assert run.monitor.check().ok  # no event: the incremental check cannot see it
    report = run.monitor.verify()
    assert f"position {req.kv.kv_allocated_len - 1} reads another token's tag" in str(report)


def test_canary_a_freed_swa_page_left_unpoisoned():
    run = front_end()
    req = running(run, decodes=0)
    run.executor.swa_pool.poison_slots = lambda slots: None  # the executor forgets to poison
    finish(run.cache, req)
    run.cache.evict(EvictParams(swa_num_tokens=64))
    assert "is not poisoned" in str(run.monitor.check())


# -- exports --------------------------------------------------------------------------------
@pytest.mark.parametrize("page_size", [1, 4])
def test_swa_exports_are_sglangs_translation(page_size):
    run = front_end(page_size=page_size, full=40, swa=28)
    req = running(run, prompt=2 * page_size + 3, decodes=2 * page_size)
    row, view = req.kv.req_pool_idx, run.engine.view
    length = req.kv.kv_allocated_len
    full = run.pool.req_to_token[row, :length].to(torch.int64)
    translated = run.alloc.translate_loc_from_full_to_swa(full)
    mapping = run.alloc.full_to_swa_index_mapping
    assert sglang_swa_req_to_token(view, [row], mapping=mapping)[0].tolist() == translated.tolist()
    by_state = sglang_swa_req_to_token(view, [row])[0].tolist()
    assert by_state[-WINDOW:] == translated[-WINDOW:].tolist()
    assert swa_slots(view, full.tolist()) == by_state
    indptr, indices = swa_window_indices(view, [row], WINDOW)
    assert indptr.tolist() == [0, WINDOW] and indices.tolist() == translated[-WINDOW:].tolist()
    with pytest.raises(ValueError, match="window"):
        swa_window_indices(view, [row], 0)
    with pytest.raises(ValueError, match="no SWA pool"):
        swa_slots(initial_state(Geometry(num_pages=4)), [1])


def test_swa_exports_refuse_dangling_entries():
    engine = Engine(state=initial_state(Geometry(num_pages=8, num_rows=2, row_width=16),
                                        swa_pages=6))
    for event in (ReqAlloc((1,)), Allocate((1, 2)), SwaAlloc(((1, 1), (2, 2))),
                  Assign(1, 0, (1, 2)), SwaFree((2,)), FreeMapped((2,))):
        engine.apply(event)
    with pytest.raises(UseAfterFree):
        swa_window_indices(engine.view, [1], 4)
    with pytest.raises(UseAfterFree):
        swa_window_indices(engine.view, [1], 4, mapping=torch.zeros(10, dtype=torch.int64))
    with pytest.raises(UseAfterFree):
        sglang_swa_req_to_token(engine.view, [1])


# -- replay ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    path = tmp_path_factory.mktemp("swa") / "run.kvlog"
    side, _, window = seeded(3, 4, executor=False, log=str(path))
    return path, window, side


def test_a_recorded_swa_log_replays_with_every_check(recorded):
    path, window, side = recorded
    header, events = read_events(path)
    events = list(events)
    start = initial_state(header.geometry, swa_pages=header.swa_pages)
    assert header.meta["sliding_window_size"] == window
    for full in (False, True):
        result = replay_hook((start, events), "cpu", check_every=1, full_checks=full,
                             swa_window=window)
        assert result.ok and result.events_applied == len(events), result.message
    assert replay_hook((start, events), "cpu", check_every=1).ok  # the window unknown
    assert main(["replay", str(path), "--executor", "cpu"]) == 0


@pytest.mark.parametrize("tail", ["end", "more"])
def test_replay_reports_a_window_page_freed_by_the_log(recorded, tail, tmp_path, capsys):
    path, window, side = recorded
    header, events = read_events(path)
    events = list(events)
    view = side.cache.engine.view
    req = side.running[0]
    slot = int(side.pool.req_to_token[req.kv.req_pool_idx, req.kv.kv_allocated_len - 1])
    bad = [*events, SwaFree((slot // header.geometry.page_size,))]
    if tail == "more":  # a decision of another kind follows: the free was not half of one
        bad.append(ReqAlloc((max(view.free_rows),)))
    start = initial_state(header.geometry, swa_pages=header.swa_pages)
    result = replay_hook((start, bad), "cpu", check_every=1, swa_window=window)
    assert not result.ok and "SWA window lost" in result.message
    assert replay_hook((start, bad), "cpu", check_every=1).ok  # no window: nothing to miss
    broken = tmp_path / "bad.kvlog"
    write_log(broken, header.geometry, bad, meta=dict(header.meta), swa_pages=header.swa_pages)
    capsys.readouterr()
    assert main(["replay", str(broken), "--executor", "cpu"]) == 1  # the window from the meta
    assert "integrity FAILED: SWA window lost" in capsys.readouterr().err


@pytest.mark.parametrize("device", DEVICES)
def test_devices_run_the_flows_with_integrity(device):
    run = front_end(page_size=4, full=16, swa=12, device=device)
    req = running(run, prompt=9, decodes=6)
    finish(run.cache, req)
    assert run.monitor.check().ok and run.monitor.verify().ok
