"""The hybrid manager's idle fast path (``kvstate.vllm.hybrid_idle.IdleSteps`` on the bounds of
``kvstate.planner.hybrid_step.idle_bounds``) never changes what a call does.

Random scheduler-like sequences of ``tools/diff_vllm_hybrid.py`` (admissions, chunks,
decodes with lookahead, preemptions, ``evict_blocks``, ``reset_prefix_cache``) run twice on
kvstate: once as shipped, once with the fast path off (every plain step then decided in
full by the planner, without ``step_is_idle`` either).  Every call's result, the free
queue, ``ref_cnt``, the tables and the KV events (and their bytes) must be the same; and
every step the fast path takes must be one ``step_is_idle`` calls idle.  The idle answers
are also held to be exact on these runs: a plain step sent to the planner must change
something, and every step decided in full must leave bounds for the next.
"""

from __future__ import annotations

import tempfile
from typing import Any

import pytest

from kvstate.planner.hybrid_step import idle_bounds, step_is_idle
from kvstate.planner.hybrid_vllm import plan_hybrid_allocate
from kvstate.vllm import hybrid
from kvstate.vllm.hybrid import HybridKVCacheManager
from kvstate.vllm.hybrid_idle import IdleSteps
from tools.bench_vllm import kvstate_api
from tools.diff_vllm_hybrid import kvstate_side, make_config, make_ops

CASES = [(layout, block_size, seed) for layout in ("swa", "mamba", "swa+mamba")
         for block_size in (1, 4, 16) for seed in range(3)]


def _trace(config: dict[str, Any], ops: list[Any]) -> list[Any]:
    with tempfile.TemporaryDirectory() as workdir:
        trace, problems = kvstate_side(config, ops, workdir)
    assert problems == []
    return trace


@pytest.mark.parametrize(("layout", "block_size", "seed"), CASES)
def test_idle_fast_path_changes_nothing(layout: str, block_size: int, seed: int,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    config = make_config(seed, layout, block_size)
    ops = make_ops(seed, 150, block_size, config["num_blocks"])
    taken = []
    original = HybridKVCacheManager.allocate_slots

    def checked(self: HybridKVCacheManager, request: Any, num_new_tokens: int,
                *args: Any, **kwargs: Any) -> Any:
        """Before each call: if the fast path would take it, ``step_is_idle`` must agree."""
        view = self.engine.view
        holders, cursors = self._holders(request.request_id), self._cursors(request.request_id)
        before = dict(self._covered)
        computed = request.num_computed_tokens
        lookahead = kwargs.get("num_lookahead_tokens", args[2] if len(args) > 2 else 0)
        if not kwargs.get("full_sequence_must_fit") and (len(args) < 2 or args[1] is None) \
                and kwargs.get("new_computed_blocks") is None and self.idle_steps.take(
                    request, num_new_tokens, args[0] if args else
                    kwargs.get("num_new_computed_tokens", 0), lookahead):
            main = computed + num_new_tokens
            assert step_is_idle(view, self.layout, holders, request, cursors,
                                min(main + lookahead, self.max_model_len), main,
                                min(main, request.num_tokens),
                                max(0, computed - request.num_in_flight_tokens))
            taken.append(request.request_id)
            self._covered.clear()
            self._covered.update(before)  # the real call below takes the step again
        return original(self, request, num_new_tokens, *args, **kwargs)

    monkeypatch.setattr(HybridKVCacheManager, "allocate_slots", checked)
    monkeypatch.setattr(hybrid, "plan_hybrid_allocate", _changes_something)
    monkeypatch.setattr(IdleSteps, "remember", _keeps_bounds)
    _MISSES.clear()
    fast = _trace(config, ops)
    assert _MISSES == []
    monkeypatch.setattr(HybridKVCacheManager, "allocate_slots", original)
    monkeypatch.setattr(hybrid, "plan_hybrid_allocate", plan_hybrid_allocate)
    monkeypatch.setattr(IdleSteps, "remember", _remember)
    monkeypatch.setattr(IdleSteps, "take", lambda *args: False)
    slow = _trace(config, ops)
    assert fast == slow


# What the two checks below found: kept here, not raised, because the differential driver
# turns an exception inside a call into that call's result.
_MISSES: list[str] = []


def _changes_something(b: Any, layout: Any, holders: Any, request: Any, cursors: Any,
                       hits: Any, **kwargs: Any) -> Any:
    """``plan_hybrid_allocate``, checking that a plain step (no hits, no full-sequence check)
    that the fast path sent here changes something: the idle answers are exact, not only safe
    (a step past a request's idle bounds, or one ``step_is_idle`` calls busy, is never idle)."""
    seq = b.state.seq
    new_pages, new_cursors, fresh = plan_hybrid_allocate(b, layout, holders, request, cursors,
                                                         hits, **kwargs)
    if hits is None and kwargs["full_tokens"] is None and b.state.seq == seq and \
            tuple(new_cursors) == tuple(cursors) and not fresh and new_pages is not None and \
            not any(new_pages):
        _MISSES.append(f"an idle step of {request.request_id} decided in full")
    return new_pages, new_cursors, fresh


_remember = IdleSteps.remember


def _keeps_bounds(self: IdleSteps, state: Any, holders: Any, request: Any, cursors: Any,
                  cache_upto: int, remove_upto: int) -> None:
    """``IdleSteps.remember``, checking that the planner found bounds: in these runs every
    request has bounds after every step decided in full (a tracked table, a prompt state
    still cached, a window's nulls in one prefix), so no later idle step needs
    ``step_is_idle``."""
    if idle_bounds(state, self.layout, holders, request, cursors, cache_upto,
                   remove_upto) is None:
        _MISSES.append(f"no idle bounds for {request.request_id}")
    _remember(self, state, holders, request, cursors, cache_upto, remove_upto)


def test_every_plain_step_decided_in_full_changes_something(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With no idle bounds kept, ``step_is_idle`` answers every plain step: each step it calls
    busy must change something (and, as above, nothing changes with the fast path off)."""
    monkeypatch.setattr(hybrid, "plan_hybrid_allocate", _changes_something)
    monkeypatch.setattr(IdleSteps, "take", lambda *args: None)
    monkeypatch.setattr(IdleSteps, "remember", lambda *args: None)
    _MISSES.clear()
    for layout, block_size, seed in CASES:
        config = make_config(seed, layout, block_size)
        _trace(config, make_ops(seed, 150, block_size, config["num_blocks"]))
    assert _MISSES == []


def _decode_run(kind: str) -> tuple[list[Any], int]:
    """Long decodes (the benchmark's loop, smaller): 60 prompts sharing a stem, at most 8
    running, every call's returned ids, tables and events; with an ``evict_blocks`` of a held
    block now and then.  Returns the trace and how often the fast path answered."""
    api = kvstate_api(None)
    manager = api["hybrid"](1024, kind)
    taken = [0]
    original = manager.idle_steps.take

    def counted(*args: Any) -> bool | None:
        answer = original(*args)
        taken[0] += bool(answer)
        return answer

    manager.idle_steps.take = counted  # type: ignore[method-assign]
    trace: list[Any] = []
    live: list[Any] = []
    for index in range(60):
        manager.new_step_starts()
        request = api["request"](f"r{index}", [index % 5] * 40 + list(range(index, index + 30)))
        blocks, hit, junction = manager.get_computed_blocks(request)
        request.shared_prefix_boundary = junction
        first = request.num_tokens - hit
        new = manager.allocate_slots(request, first, hit, blocks, full_sequence_must_fit=True)
        trace.append(None if new is None else new.get_block_ids())
        if new is not None:
            request.num_computed_tokens = hit + first
            live.append(request)
            if index % 3 == 1:
                # the last group's block at the prompt's last state leaves the cache (a Mamba
                # group caches that state again at its next step)
                last = manager.get_block_ids(request.request_id)[-1]
                position = (request.num_prompt_tokens - 1) // manager.block_size - 1
                if 0 <= position < len(last) and last[position]:
                    manager.evict_blocks({last[position]})
        for step, running in enumerate(live):
            running.append_output_token_ids(index + step)
            new = manager.allocate_slots(running, 1, num_lookahead_tokens=step % 3)
            trace.append(None if new is None else new.get_block_ids())
            running.num_computed_tokens += 1
        if index % 7 == 3 and live:
            tables = manager.get_block_ids(live[-1].request_id)
            manager.evict_blocks({table[0] for table in tables if table and table[0]})
        if len(live) > 8:
            manager.free(live.pop(0))
        trace.append([manager.get_block_ids(r.request_id) for r in live])
        trace.append(manager.take_events())
    return trace, taken[0]


@pytest.mark.parametrize("kind", ["full+swa", "full+mamba", "full+swa+mamba"])
def test_idle_fast_path_on_long_decodes(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hybrid, "plan_hybrid_allocate", _changes_something)
    monkeypatch.setattr(IdleSteps, "remember", _keeps_bounds)
    _MISSES.clear()
    fast, taken = _decode_run(kind)
    assert taken > 200 and _MISSES == []
    monkeypatch.setattr(hybrid, "plan_hybrid_allocate", plan_hybrid_allocate)
    monkeypatch.setattr(IdleSteps, "remember", _remember)
    monkeypatch.setattr(IdleSteps, "take", lambda *args: False)
    slow, none = _decode_run(kind)
    assert none == 0
    assert fast == slow
