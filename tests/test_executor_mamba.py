"""The executor's Mamba states (FULL + MAMBA hybrids): the state pool per slot, the Mamba plans
and byte moves, integrity over state owners and reads, exports, replay.

Driven by the real front end (``HybridReqToTokenPool``, ``UnifiedRadixCache(FULL, MAMBA)`` and
``mamba_scheduler``'s admit / prefill / decode / finish, plus the seeded op lists of
``tools/diff_sglang_mamba.py``), with a canary per check: each corruption below must be
reported, and the same runs without it must pass.
"""

from __future__ import annotations

import ast
import json
import sys
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
    Insert,
    MambaAlloc,
    MambaBind,
    MambaCommit,
    MambaCopy,
    MambaDonate,
    MambaEvict,
    MambaFree,
    MambaLock,
    MambaTouch,
    ReqAlloc,
    ReqFree,
    Reset,
)
from kvstate.executor import (
    MambaStateConfig,
    MambaStateLost,
    MambaStatePool,
    MambaTorchExecutor,
    SwaMambaTorchExecutor,
    SwaModelConfig,
    enable_integrity,
    gather_mamba_states,
    plan_indices,
    replay_hook,
    sglang_mamba_indices,
    sglang_mamba_track_indices,
)
from kvstate.executor.index_plan import EMPTY_PLAN
from kvstate.log import Recorder, read_events
from kvstate.log.writer import write_log
from kvstate.sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from kvstate.sglang.mamba_pool import HybridReqToTokenPool
from kvstate.sglang.mamba_radix_cache import MambaCacheInitParams
from kvstate.sglang.mamba_req import MambaReq
from kvstate.sglang.mamba_scheduler import admit, decode_step, finish, prefill_done
from kvstate.sglang.params import EvictParams
from kvstate.sglang.unified_radix_cache import UnifiedRadixCache
from kvstate.state import initial_state

TOOLS = Path(__file__).resolve().parent.parent / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))
from diff_sglang_mamba import generate  # noqa: E402
from mamba_ops import apply_op  # noqa: E402
from mamba_sides import Side  # noqa: E402

MODEL = ModelConfig(num_layers=2, num_kv_heads=1, head_dim=8)
STATES = MambaStateConfig.mamba2((2, 5), intermediate_size=4, n_groups=1, num_heads=2,
                                 head_dim=2, state_size=2, conv_kernel=4)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))]


def front_end(*, extra=False, page=1, slots=10, pages=64, device="cpu", infer=True,
              integrity=True):
    """The SGLang Mamba front end on a shared engine, a Mamba executor following it."""
    pool = HybridReqToTokenPool(size=4, mamba_size=slots, max_context_len=128,
                                enable_mamba_extra_buffer=extra)
    alloc = TokenToKVPoolAllocator(pages) if page == 1 else \
        PagedTokenToKVPoolAllocator(pages * page, page)
    cache = UnifiedRadixCache(MambaCacheInitParams(
        req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=page,
        tree_components=("FULL", "MAMBA"), enable_mamba_extra_buffer=extra,
        mamba_chunk_size=4, mamba_track_interval=8))
    executor = MambaTorchExecutor(MODEL, STATES, pages, page, slots, device=device,
                                  poison_freed=True)
    executor.attach(cache.engine)
    monitor = enable_integrity(executor, request_pool=pool, infer_mamba_states=infer) \
        if integrity else None
    return SimpleNamespace(pool=pool, alloc=alloc, cache=cache, engine=cache.engine,
                           executor=executor, monitor=monitor, infer=infer)


class Forward:
    """What a model's forward pass writes, told to the monitor (``write_state``): the running
    state after each extend or decode step and the tracked checkpoints of the extra buffer."""

    def __init__(self, run):
        self.run = run

    def after_step(self, req, start):
        kv = req.kv
        monitor = self.run.monitor
        if not self.run.infer:
            monitor.write_state(kv.mamba_pool_idx, kv.req_pool_idx, kv.kv_committed_len,
                                start=start)
        if kv.mamba_ping_pong_track_buffer is not None and kv.mamba_last_track_seqlen and \
                getattr(req, "written_track", None) != kv.mamba_last_track_seqlen:
            slot = kv.mamba_ping_pong_track_buffer[kv.mamba_last_track_idx]
            monitor.write_state(slot, kv.req_pool_idx, kv.mamba_last_track_seqlen)
            req.written_track = kv.mamba_last_track_seqlen

    def admit(self, req):
        admit(self.run.cache, req)
        self.after_step(req, req.prefix_len)
        prefill_done(self.run.cache, req, 7)

    def decode(self, reqs):
        starts = [req.kv.kv_committed_len for req in reqs]
        decode_step(self.run.cache, reqs, 7)
        for req, start in zip(reqs, starts, strict=True):
            self.after_step(req, start)


def serve(run, prompts, decodes=6, check=True):
    """Admit each prompt (copy-on-match where it shares a prefix), decode all, finish all."""
    forward = Forward(run)
    reqs = []
    for number, prompt in enumerate(prompts):
        req = MambaReq(number, prompt)
        forward.admit(req)
        reqs.append(req)
        if check:
            assert run.monitor.check().ok, str(run.monitor.check())
    for _ in range(decodes):
        forward.decode(reqs)
        if check:
            report = run.monitor.check()
            assert report.ok, str(report)
    return forward, reqs


PROMPT = list(range(1, 21))


def seeded(config, seed, page, steps=120, log=None, check=True):
    """A differential seed's ops on kvstate's Mamba front end, checked after every op."""
    setup, ops = generate(config, seed, steps, page)
    side = Side("kvstate", "-", setup)
    engine = side.cache.engine
    recorder = Recorder(engine, log, fsync=False) if log else None
    executor = MambaTorchExecutor(MODEL, STATES, setup["full_pages"], page,
                                  setup["mamba_slots"], device="cpu", poison_freed=True)
    executor.attach(engine)
    monitor = enable_integrity(executor, request_pool=side.pool)
    for op in ops:
        apply_op(side, op)
        if check:
            report = monitor.check()
            assert report.ok, (op, str(report))
    if recorder is not None:
        recorder.close()
    return side, monitor


# -- configuration and buffers ----------------------------------------------------------
@pytest.mark.parametrize(("fields", "message"), [
    ({"layers": ()}, "at least one Mamba layer"),
    ({"layers": (1, 1)}, "twice"),
    ({"layers": (-1,)}, "layer id"),
    ({"conv_shapes": ()}, "at least one shape"),
    ({"conv_shapes": ((4, 0),)}, "positive"),
    ({"temporal_shape": ()}, "non-empty"),
    ({"conv_dtype": "int8"}, "conv_dtype"),
])
def test_config_refuses_bad_shapes(fields, message):
    base = {"layers": (0,), "conv_shapes": ((4, 3),), "temporal_shape": (2, 2, 2)}
    with pytest.raises(ValueError, match=message):
        MambaStateConfig(**{**base, **fields})


def test_mamba2_shapes_and_the_pool_layout():
    config = MambaStateConfig.mamba2([3, 7], intermediate_size=32, n_groups=1, num_heads=2,
                                     head_dim=16, state_size=4, conv_kernel=4)
    assert config.conv_shapes == ((40, 3),) and config.temporal_shape == (2, 16, 4)
    assert config.layers_mapping == {3: 0, 7: 1}
    assert config.bytes_per_slot == (40 * 3 * 2 + 2 * 16 * 4 * 4) * 2
    pool = MambaStatePool(config, 5)
    assert pool.conv_state[0].shape == (2, 6, 40, 3) and pool.conv_state[0].dtype == torch.bfloat16
    assert pool.temporal_state.shape == (2, 6, 2, 16, 4)
    assert pool.temporal_state.dtype == torch.float32
    assert pool.nbytes == config.bytes_per_slot * 6
    conv, ssm = pool.layer_cache(7)
    assert ssm.shape == (6, 2, 16, 4) and conv[0].data_ptr() == pool.conv_state[0][1].data_ptr()
    pool.set_state(7, [2], [torch.ones(1, 40, 3)], torch.full((1, 2, 16, 4), 2.0))
    conv2, ssm2 = pool.get_state(2)
    assert conv2[0][1].eq(1).all() and ssm2[1].eq(2).all() and not ssm2[0].any()
    with pytest.raises(ValueError, match="not one of the Mamba layers"):
        pool.layer_cache(4)
    with pytest.raises(IndexError):
        pool.copy_slots([1], [6])
    with pytest.raises(ValueError, match="conv_kernel"):
        MambaStateConfig.mamba2([0], intermediate_size=4, n_groups=1, num_heads=1, head_dim=1,
                                state_size=1, conv_kernel=1)


def test_attach_needs_the_matching_mamba_pool():
    executor = MambaTorchExecutor(MODEL, STATES, 8, 1, 5, device="cpu")
    for engine, message in ((Engine(Geometry(num_pages=8)), "no Mamba pool"),
                            (Engine(state=initial_state(Geometry(num_pages=8), mamba_slots=4)),
                             "4 slots")):
        with pytest.raises(ValueError, match=message):
            executor.attach(engine)
    assert executor.engine is None  # nothing changed on a refusal
    with pytest.raises(TypeError):
        MambaTorchExecutor(MODEL, MODEL, 8, 1, 5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mamba_slots"):
        MambaTorchExecutor(MODEL, STATES, 8, 1, 0)


# -- plans ----------------------------------------------------------------------------------
def planned_engine():
    """Row 1 holds running slot 1 and track slot 2; node 1 (tokens 0..3) holds state 3."""
    engine = Engine(state=initial_state(Geometry(num_pages=8, num_rows=2, row_width=32),
                                        mamba_slots=6))
    for event in (ReqAlloc((1,)), MambaAlloc((1, 2, 3)), MambaBind(1, (1, 2)),
                  Allocate((1, 2, 3, 4)), Assign(1, 0, (1, 2, 3, 4)),
                  Insert(0, (9, 9, 9, 9), (1, 2, 3, 4), 1, 1, 1), MambaCommit(1, 3, 2)):
        engine.apply(event)
    return engine


def test_mamba_events_plan_owners_copies_and_frees():
    state = planned_engine().state
    assert plan_indices(state, MambaAlloc((4, 5))).mamba_taken == (4, 5)
    assert plan_indices(state, MambaBind(1, (4, 0))).mamba_bound == ((1, (4, 0)),)
    donated = plan_indices(state, MambaDonate(1, 1, 4))
    assert donated.mamba_donated == ((1, 1, 2, 4),) and not donated.moves_bytes
    copied = plan_indices(state, MambaCopy(3, 1))
    assert (copied.mamba_copy_src, copied.mamba_copy_dst) == ((3,), (1,)) and copied.moves_bytes
    assert plan_indices(state, MambaFree((2, 1))).mamba_freed == (2, 1)
    assert plan_indices(state, MambaEvict((1,))).mamba_freed == (3,)
    assert plan_indices(state, Reset("tree")).mamba_freed == (3,)
    assert plan_indices(state, Reset("all")).mamba_freed == (1, 2, 3)
    assert not plan_indices(state, Reset("rows")).mamba_freed
    for event in (MambaTouch(1, 3), MambaLock(1)):
        assert plan_indices(state, event) is EMPTY_PLAN
    engine = planned_engine()
    engine.apply(Allocate((5, 6)))
    engine.apply(Insert(1, (8, 8), (5, 6), 2, 3))
    engine.apply(MambaAlloc((4,)))
    assert plan_indices(engine.state, MambaCommit(2, 4, 4)).mamba_committed == ((2, 4, 6),)


def test_planning_imports_no_torch():
    root = Path(__file__).resolve().parent.parent / "kvstate" / "executor"
    for name in ("plan_mamba", "mamba_config", "integrity_mamba_owners"):
        tree = ast.parse((root / f"{name}.py").read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                    if isinstance(node, ast.Import) for alias in node.names}
        imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom)}
        assert not imported & {"torch", "numpy"}, name


# -- byte moves ---------------------------------------------------------------------------
def test_copies_move_states_frees_poison_and_owner_changes_move_nothing():
    engine = Engine(state=initial_state(Geometry(num_pages=8, num_rows=2, row_width=32),
                                        mamba_slots=6))
    ex = MambaTorchExecutor(MODEL, STATES, 8, 1, 6, device="cpu", poison_freed=True)
    ex.attach(engine)
    pool = ex.mamba_pool
    for tensor in pool.tensors:  # every slot a different value, every layer too
        tensor.copy_(torch.arange(tensor.numel(), dtype=torch.float32).reshape(tensor.shape))
    before = [t.clone() for t in pool.tensors]
    for event in (ReqAlloc((1,)), MambaAlloc((1, 2, 3)), MambaBind(1, (1, 2))):
        engine.apply(event)
    engine.apply(MambaCopy(2, 3))
    for tensor, old in zip(pool.tensors, before, strict=True):
        assert torch.equal(tensor[:, 3], old[:, 2]) and torch.equal(tensor[:, 2], old[:, 2])
    snapshot = [t.clone() for t in pool.tensors]
    engine.apply(MambaAlloc((4,)))
    engine.apply(MambaDonate(1, 1, 4))
    for event in (Allocate((1,)), Assign(1, 0, (1,)), Insert(0, (5,), (1,), 1, 1, 1),
                  MambaCommit(1, 2, 2)):
        engine.apply(event)
    assert all(torch.equal(a.view(torch.int8) if a.dtype != torch.float32 else a, b.view(
        torch.int8) if b.dtype != torch.float32 else b) for a, b in zip(pool.tensors, snapshot,
                                                                         strict=True))
    engine.apply(MambaFree((3,)))
    engine.apply(MambaEvict((1,)))
    for tensor in pool.tensors:
        assert torch.isnan(tensor[:, 3]).all() and torch.isnan(tensor[:, 2]).all()
        assert not torch.isnan(tensor[:, 1]).any() and not torch.isnan(tensor[:, 0]).any()


# -- integrity over real front-end runs ----------------------------------------------------
@pytest.mark.parametrize(("extra", "page", "infer"), [(False, 1, True), (False, 1, False),
                                                       (True, 1, True), (True, 4, False)])
def test_scheduler_flows_pass_every_check(extra, page, infer):
    run = front_end(extra=extra, page=page, infer=infer)
    shared = PROMPT + [30, 31, 32, 33]  # resumes from the first request's cached state
    forward, reqs = serve(run, [PROMPT, shared], decodes=10)
    kinds = Counter(type(e).__name__ for e in run.engine.events)
    assert kinds["MambaCopy"] and kinds["MambaCommit"] and (kinds["MambaDonate"] or not extra)
    for req in reqs:
        finish(run.cache, req)
        assert run.monitor.check().ok, str(run.monitor.check())
    assert run.monitor.verify().ok, str(run.monitor.verify())
    third = MambaReq(9, shared + [40])  # a hit on a state a request left in the tree
    forward.admit(third)
    assert third.prefix_len > 0 and run.monitor.check().ok and run.monitor.verify().ok


@pytest.mark.parametrize(("config", "seed", "page"), [("mamba-nobuf", 1, 1),
                                                      ("mamba-extra", 3, 4)])
def test_seeded_runs_pass_every_check(config, seed, page):
    side, monitor = seeded(config, seed, page)
    assert monitor.verify().ok
    kinds = Counter(type(e).__name__ for e in side.cache.engine.events)
    for kind in ("MambaCopy", "MambaCommit", "MambaEvict", "MambaFree", "Evict", "Split"):
        assert kinds[kind], kind


def test_attaching_mid_run_tags_what_the_state_holds():
    setup, ops = generate("mamba-nobuf", 2, 60, 1)
    side = Side("kvstate", "-", setup)
    for op in ops:
        apply_op(side, op)
    ex = MambaTorchExecutor(MODEL, STATES, setup["full_pages"], 1, setup["mamba_slots"],
                            device="cpu", poison_freed=True)
    ex.attach(side.cache.engine)
    monitor = enable_integrity(ex, request_pool=side.pool)
    assert side.cache.engine.view.mamba.slot_node and monitor.verify().ok
    for req in [r for r in side.running if not r.finished()]:
        decode_step(side.cache, [req], 3)
        finish(side.cache, req)
    assert monitor.check().ok and monitor.verify().ok


# -- canaries -------------------------------------------------------------------------------
def test_canary_a_copy_on_match_whose_bytes_were_not_copied():
    run = front_end()
    forward, _ = serve(run, [PROMPT], decodes=1)
    run.executor.mamba_pool.copy_slots = lambda src, dst: None  # the executor skips the copy
    forward.admit(MambaReq(1, PROMPT + [50, 51]))
    report = run.monitor.check()
    assert "resumes at position" in str(report) and "its bytes are not that state" in str(report)


def test_canary_a_copy_on_match_that_never_happened(monkeypatch):
    run = front_end()
    forward, _ = serve(run, [PROMPT], decodes=1)
    from kvstate.planner.mamba_slots import plan_take_slots

    def no_copy(b, found, held, *, at_head, window):  # the front end forgets the copy
        return held or plan_take_slots(b, 1)[0]

    monkeypatch.setattr("kvstate.sglang.mamba_radix_cache.plan_copy_on_match", no_copy)
    req = MambaReq(1, PROMPT + [50, 51])
    forward.admit(req)
    assert req.prefix_len > 0
    assert "which holds no state computed for it" in str(run.monitor.check())


@pytest.mark.parametrize("infer", [True, False])
def test_canary_a_running_slot_freed_and_reused(infer):
    run = front_end(infer=infer)
    forward, (first,) = serve(run, [PROMPT], decodes=1)
    slot = first.kv.mamba_pool_idx
    allocator = run.pool.mamba_allocator
    allocator.alloc(allocator.available_size())  # held elsewhere: the freed slot comes next
    allocator.free([slot])  # a bug: the slot goes back while the request runs
    assert run.monitor.check().ok  # nobody read it yet
    second = MambaReq(1, [70, 71, 72])
    admit(run.cache, second)  # it takes the slot and computes its prompt in it
    forward.after_step(second, 0)
    assert second.kv.mamba_pool_idx == slot and run.monitor.check().ok
    forward.decode([first])
    report = str(run.monitor.check())
    if infer:
        assert "holds no running Mamba state (its slot left the row)" in report
    else:
        assert f"writes Mamba slot {slot}, which it does not hold (row" in report
    with pytest.raises(MambaStateLost):
        sglang_mamba_indices(run.engine.view, [first.kv.req_pool_idx])


def test_canary_a_state_the_tree_keeps_overwritten_by_a_request():
    run = front_end(extra=True, infer=False)
    forward, (req,) = serve(run, [PROMPT], decodes=0)
    node_slots = dict(run.engine.view.mamba.slot_node)
    assert node_slots  # the prefill checkpoint donated a track slot to the tree
    donated = next(iter(node_slots))
    run.monitor.write_state(donated, req.kv.req_pool_idx, 30)  # a stale track index
    report = str(run.monitor.check())
    assert f"writes Mamba slot {donated}, which it does not hold (the state of tree node" in report
    assert f"Mamba slot {donated} (the state of tree node" in report and "overwrote" in report


def test_canary_state_bytes_changed_by_no_event():
    run = front_end()
    serve(run, [PROMPT], decodes=0)
    slot = next(iter(run.engine.view.mamba.slot_node))
    run.executor.mamba_pool.temporal_state[1, slot] = 3.0  # a kernel writes where it must not
    assert run.monitor.check().ok  # no event: the incremental check cannot see it
    assert f"Mamba slot {slot} (the state of tree node" in str(run.monitor.verify())


def test_canary_a_checkpoint_of_the_wrong_position():
    run = front_end(extra=True, infer=False)
    req = MambaReq(0, PROMPT)
    admit(run.cache, req)
    kv = req.kv
    run.monitor.write_state(kv.mamba_pool_idx, kv.req_pool_idx, kv.kv_committed_len)
    slot = kv.mamba_ping_pong_track_buffer[kv.mamba_last_track_idx]
    run.monitor.write_state(slot, kv.req_pool_idx, kv.mamba_last_track_seqlen - 4)  # off grid
    req.written_track = kv.mamba_last_track_seqlen
    prefill_done(run.cache, req, 7)  # the checkpoint hands that slot to the tree
    assert "the slot holds the state of position" in str(run.monitor.check())


def test_canary_a_freed_state_left_unpoisoned():
    run = front_end()
    _, (req,) = serve(run, [PROMPT], decodes=0)
    finish(run.cache, req)
    assert run.monitor.check().ok
    run.executor.mamba_pool.poison_slots = lambda slots: None  # the executor forgets to poison
    assert run.cache.evict(EvictParams(num_tokens=0, mamba_num=4)).mamba_num_evicted
    assert "is not poisoned" in str(run.monitor.check())


def test_canary_a_mapping_tensor_entry_corrupted():
    run = front_end()
    _, (first, second) = serve(run, [PROMPT, [60, 61, 62]], decodes=1)
    mapping = run.pool.req_index_to_mamba_index_mapping
    mapping[first.kv.req_pool_idx] = second.kv.mamba_pool_idx
    report = str(run.monitor.verify())
    assert "via req_index_to_mamba_index_mapping: request" in report
    assert f"req_index_to_mamba_index_mapping[{first.kv.req_pool_idx}]" in report


# -- exports --------------------------------------------------------------------------------
@pytest.mark.parametrize("extra", [False, True])
def test_exports_are_sglangs_state_indices(extra):
    run = front_end(extra=extra)
    _, reqs = serve(run, [PROMPT, [60, 61, 62]], decodes=2)
    rows = [req.kv.req_pool_idx for req in reqs]
    view = run.engine.view
    indices = sglang_mamba_indices(view, rows)
    assert indices.dtype == torch.int32
    assert indices.tolist() == run.pool.get_mamba_indices(torch.tensor(rows)).tolist()
    mapping = run.pool.req_index_to_mamba_index_mapping
    assert sglang_mamba_indices(view, rows, mapping=mapping).tolist() == indices.tolist()
    track = sglang_mamba_track_indices(view, rows)
    if extra:
        table = run.pool.req_index_to_mamba_ping_pong_track_buffer_mapping
        assert track.tolist() == table[rows].tolist() and track.shape == (2, 2)
    else:
        assert track.shape == (2, 0)
    conv, ssm = gather_mamba_states(run.executor, indices, 5)
    pool = run.executor.mamba_pool
    assert torch.equal(ssm, pool.temporal_state[1, indices.long()])
    assert torch.equal(conv[0], pool.conv_state[0][1, indices.long()])
    with pytest.raises(KeyError):
        sglang_mamba_indices(view, [next(r for r in range(1, 5) if r not in view.requests)])
    with pytest.raises(ValueError, match="no Mamba pool"):
        sglang_mamba_indices(initial_state(Geometry(num_pages=4)), [1])


# -- replay ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    path = tmp_path_factory.mktemp("mamba") / "run.kvlog"
    seeded("mamba-nobuf", 4, 1, steps=100, log=str(path), check=False)
    return path


def test_a_recorded_mamba_log_replays_with_every_check(recorded, capsys):
    header, events = read_events(recorded)
    events = list(events)
    assert header.mamba_slots
    start = initial_state(header.geometry, mamba_slots=header.mamba_slots)
    for full in (False, True):
        result = replay_hook((start, events), "cpu", check_every=1, full_checks=full)
        assert result.ok and result.events_applied == len(events), result.message
        assert "Mamba states" in result.message
    assert "Mamba" not in replay_hook((start, events), "cpu", mamba_config=None).message
    capsys.readouterr()
    assert main(["replay", str(recorded), "--executor", "cpu", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["executor"]
    assert report["ok"] and report["mamba_slots"] == header.mamba_slots


def test_replay_reports_a_copy_missing_from_the_log(recorded, tmp_path, capsys):
    header, events = read_events(recorded)
    events = list(events)
    bound = {i: {slot for later in events[i:i + 8] if isinstance(later, MambaBind)
                 for slot in later.slots} for i, e in enumerate(events) if isinstance(e, MambaCopy)}
    copies = [i for i, slots in bound.items() if events[i].dst in slots]  # copy-on-match
    assert copies
    bad = events[:copies[0]] + events[copies[0] + 1:]  # the rules never needed the copy
    start = initial_state(header.geometry, mamba_slots=header.mamba_slots)
    result = replay_hook((start, bad), "cpu", check_every=1)
    assert not result.ok and "Mamba slot" in result.message
    broken = tmp_path / "bad.kvlog"
    write_log(broken, header.geometry, bad, meta=dict(header.meta),
              mamba_slots=header.mamba_slots)
    capsys.readouterr()
    assert main(["replay", str(broken), "--executor", "cpu"]) == 1
    assert "integrity FAILED" in capsys.readouterr().err


@pytest.mark.parametrize("device", DEVICES)
def test_devices_run_the_flows_with_integrity(device):
    run = front_end(extra=True, page=4, device=device)
    _, reqs = serve(run, [PROMPT, PROMPT + [30, 31]], decodes=4)
    for req in reqs:
        finish(run.cache, req)
    assert run.monitor.check().ok and run.monitor.verify().ok


def test_swa_mamba_executor_holds_both_pools():
    config = SwaModelConfig(MODEL, (0,), (1,), 4)
    ex = SwaMambaTorchExecutor(config, STATES, 16, 1, 12, 6, device="cpu", poison_freed=True)
    engine = Engine(state=initial_state(Geometry(num_pages=16, num_rows=2, row_width=32),
                                        swa_pages=12, mamba_slots=6))
    ex.attach(engine)
    monitor = enable_integrity(ex)
    assert monitor.swa is not None and monitor.mamba is not None
    for event in (ReqAlloc((1,)), MambaAlloc((1,)), MambaBind(1, (1,)), ReqFree((1,)),
                  MambaFree((1,))):
        engine.apply(event)
    assert monitor.check().ok and torch.isnan(ex.mamba_pool.temporal_state[:, 1]).all()


def test_owners_the_plans_made_are_compared_with_the_states():
    run = front_end()
    _, (req,) = serve(run, [PROMPT], decodes=1)
    row = req.kv.req_pool_idx
    run.monitor.mamba.rows[row][0] = 9  # as if a planner lost track of the row's slot
    run.monitor.mamba.rows_touched.add(row)
    assert f"row {row!r} holds Mamba slots [9] to the monitor" in str(run.monitor.check())
    assert "to the monitor" in str(run.monitor.verify())


def test_one_state_tags_are_the_vector_tags():
    import random

    import numpy as np

    from kvstate.executor.integrity_mamba_tags import tag_row
    from kvstate.executor.integrity_tags import plane_const, tag_array

    rng = random.Random(5)
    for _ in range(300):
        uid, position = rng.randint(0, 1 << 40), rng.randint(0, 1 << 20)
        consts = [plane_const(rng.randint(0, 1 << 17), rng.randint(0, 3))
                  for _ in range(rng.randint(1, 4))]
        width = rng.randint(1, 40)
        want = tag_array(np.array([uid]), np.array([position]), np.array(consts), width)
        assert np.array_equal(tag_row(uid, position, [c % (1 << 64) for c in consts], width),
                              want)
