"""The torch executor: real KV buffers that mirror every event.

``TorchExecutor`` (MHA) and ``MLATorchExecutor`` own the buffers; the pure
``plan`` module turns ``(state_before, state_after, event)`` into index lists;
``exports`` reads buffers and states in kernel layouts; ``integrity`` writes
and verifies per-token tags; ``host`` is the pinned host pool.  This package
imports torch; the pure core never imports it.

``replay_hook`` is what ``kvstate replay --executor cpu|cuda`` calls: it
rebuilds buffers while replaying a log with integrity mode on, for radix-mode
(SGLang) and block-mode (vLLM front end, :mod:`kvstate.executor.plan_block`)
logs alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from kvstate.config import ModelConfig
from kvstate.errors import InvalidEvent
from kvstate.events import Event
from kvstate.executor import plan_block  # noqa: F401  (registers the block-mode index planners)
from kvstate.executor.buffers import TorchExecutor, default_device
from kvstate.executor.exports import (
    flashinfer_page_table,
    gather_kv,
    sglang_req_to_token,
    vllm_block_table,
    vllm_slot_mapping,
)
from kvstate.executor.host import HostPool
from kvstate.executor.integrity import IntegrityMonitor, IntegrityReport, enable_integrity
from kvstate.executor.mla import MLAConfig, MLATorchExecutor
from kvstate.executor.plan import IndexPlan, plan_indices
from kvstate.state import State
from kvstate.state_host import TieredState

REPLAY_MODEL = ModelConfig(num_layers=2, num_kv_heads=1, head_dim=8)


@attrs.frozen
class ReplayResult:
    """Outcome of an executor replay: ``ok`` and a one-line ``message``."""

    ok: bool
    message: str
    events_applied: int = 0
    tokens_checked: int = 0


def replay_hook(source: Any, device: str = "cpu", *, events: Iterable[Event] | None = None,
                model_config: ModelConfig = REPLAY_MODEL, check_every: int = 0) -> ReplayResult:
    """Replay a log into fresh buffers with integrity mode on, then verify every token.

    Freed slots are poisoned (NaN), so stale bytes never pass for live ones.

    ``source`` is an ``Engine`` (its initial state and events are used), a
    ``(initial_state, events)`` pair, or an initial ``State`` with ``events=``.
    An initial ``TieredState`` (a host-tier log) also gets a ``HostPool`` of
    its host pages, so offload and load move real bytes and host copies are
    verified too.
    ``check_every`` > 0 also verifies after every that many events.  Never
    raises for a bad log: an invalid event or a failed check is reported in
    the result.
    """
    initial, stream = _split_source(source, events)
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return ReplayResult(False, "--executor cuda: no CUDA device is available")
    core = initial.core if isinstance(initial, TieredState) else initial
    geometry = core.geometry
    import torch

    # Freed slots are poisoned so that a page whose bytes should have been
    # rewritten (a load, a copy) cannot pass by still holding its old tags.
    executor = TorchExecutor(model_config, geometry.num_pages, geometry.page_size,
                             dtype=torch.float16, device=device, poison_freed=True)
    executor.reset_state(core)  # radix or block mode: both have index planners
    if isinstance(initial, TieredState):
        executor.enable_host(HostPool(executor, initial.host.num_pages), initial.host)
    monitor = enable_integrity(executor)
    applied = 0
    checked = 0
    for event in stream:
        try:
            executor.apply(event)
        except InvalidEvent as exc:
            return ReplayResult(False, f"replay stopped: {exc}", applied, checked)
        applied += 1
        if check_every and applied % check_every == 0:
            report = monitor.verify()
            checked += report.tokens_checked
            if not report.ok:
                return ReplayResult(False, f"after event #{applied - 1}: {report}", applied, checked)
    report = monitor.verify()
    checked += report.tokens_checked
    checks = 1 + (applied // check_every if check_every else 0)
    if report.ok:
        message = (f"{applied} events replayed on {executor.device}; integrity ok in {checks} "
                   f"checks: {checked} token reads matched their tags")
    else:
        message = f"{applied} events replayed on {executor.device}; {report}"
    return ReplayResult(report.ok, message, applied, checked)


def _split_source(source: Any, events: Iterable[Event] | None
                  ) -> tuple[State | TieredState, Iterable[Event]]:
    if isinstance(source, (State, TieredState)):
        return source, (events if events is not None else ())
    if isinstance(source, tuple) and len(source) == 2 and isinstance(source[0], (State, TieredState)):
        return source[0], source[1]
    if hasattr(source, "initial_state") and hasattr(source, "events"):
        return source.initial_state, (source.events if events is None else events)
    raise TypeError("replay_hook needs an Engine, a (State, events) pair or a State with events=")


__all__ = [
    "HostPool",
    "IndexPlan",
    "IntegrityMonitor",
    "IntegrityReport",
    "MLAConfig",
    "MLATorchExecutor",
    "ReplayResult",
    "TorchExecutor",
    "default_device",
    "enable_integrity",
    "flashinfer_page_table",
    "gather_kv",
    "plan_indices",
    "replay_hook",
    "sglang_req_to_token",
    "vllm_block_table",
    "vllm_slot_mapping",
]
