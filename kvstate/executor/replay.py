"""Standalone executor replay: rebuild real KV buffers from an event log and verify them.

``replay_hook`` is what ``kvstate replay --executor cpu|cuda`` calls.  It
drives a live ``Engine`` over the log's events with a ``TorchExecutor``
attached (and, for a host-tier log, its ``HostPool``; for an SWA or Mamba
hybrid log, the executor with those layers), in integrity mode, so every
event moves the bytes it implies and every token and state reads back its tag.
It owns the engine, the executor and the monitor it builds; the caller's
state and events are only read.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from kvstate.config import ModelConfig
from kvstate.engine import Engine
from kvstate.errors import InvalidEvent
from kvstate.events import Event
from kvstate.executor.buffers import TorchExecutor
from kvstate.executor.integrity import enable_integrity
from kvstate.executor.mamba_config import MambaStateConfig
from kvstate.executor.mamba_executor import MambaTorchExecutor, SwaMambaTorchExecutor
from kvstate.executor.swa_config import SwaModelConfig
from kvstate.executor.swa_executor import SwaTorchExecutor
from kvstate.state import State

REPLAY_MODEL = ModelConfig(num_layers=2, num_kv_heads=1, head_dim=8)
# An SWA log (a state with an SWA pool): layer 0 full attention, layer 1 sliding window.
REPLAY_SWA_LAYERS = ((0,), (1,))
SWA_WINDOW_META = "sliding_window_size"  # the header meta key a recorder stores the window under
# A Mamba log (a state with a Mamba pool): one Mamba layer (model layer 2) of a tiny Mamba2
# mixer beside the attention layers; SGLang's dtypes (bfloat16 conv, float32 SSM state).
REPLAY_MAMBA = MambaStateConfig.mamba2((2,), intermediate_size=4, n_groups=1, num_heads=2,
                                       head_dim=2, state_size=2, conv_kernel=4)


def swa_window_of(meta: Any) -> int | None:
    """The sliding window a log header's ``meta`` records, or None (absent or not a positive int)."""
    value = meta.get(SWA_WINDOW_META) if isinstance(meta, dict) else None
    return value if type(value) is int and value > 0 else None


@attrs.frozen
class ExecutorReplay:
    """Outcome of an executor replay: ``ok`` and a one-line ``message``."""

    ok: bool
    message: str
    events_applied: int = 0
    tokens_checked: int = 0


def replay_hook(source: Any, device: str = "cpu", *, events: Iterable[Event] | None = None,
                model_config: ModelConfig = REPLAY_MODEL, check_every: int = 0,
                full_checks: bool = False, swa_window: int | None = None,
                swa_layers: bool = True, mamba_config: MambaStateConfig | None = REPLAY_MAMBA
                ) -> ExecutorReplay:
    """Replay a log into fresh buffers with integrity mode on, then verify every token.

    Freed slots are poisoned (NaN), so stale bytes never pass for live ones.
    ``source`` is an ``Engine`` (its initial state and events are used), a
    ``(initial_state, events)`` pair, or an initial ``State`` with ``events=``;
    a state with a host tier gets a ``HostPool`` of its host pages, so offload
    and load move real bytes and host copies are verified too.

    ``check_every`` > 0 also checks after every that many events: an
    incremental check (what changed since the previous one), or a full
    verification of everything with ``full_checks``.  The end is always a
    full verification.  Never raises for a bad log: an invalid event or a
    failed check is reported in the result.

    A state with an SWA pool (a FULL + SWA hybrid) gets a ``SwaTorchExecutor``
    (``model_config``'s layers split by ``REPLAY_SWA_LAYERS``), so the SWA
    events move, poison and re-pair real SWA bytes.  ``swa_window`` is the
    model's sliding window in tokens (a log records it in its header's meta
    under ``SWA_WINDOW_META``, read by :func:`swa_window_of`): with it every
    request's last window must still have its SWA KV; without it only the
    SWA KV that is there is checked.  ``swa_layers=False`` mirrors the FULL
    pool only (a plain ``TorchExecutor``, as for a log without SWA).

    A state with a Mamba pool (a FULL + MAMBA hybrid, the log header's
    ``mamba_slots``) also gets ``mamba_config``'s state tensors for every slot
    (:mod:`kvstate.executor.mamba_executor`): copies move real states, frees
    poison them, and the monitor infers the states a log implies (a running
    state follows its row's KV, a checkpoint is written where the tree takes
    it) and checks every read and owner.  ``mamba_config=None`` leaves the
    Mamba states out.
    """
    initial, stream = _split_source(source, events)
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        return ExecutorReplay(False, "--executor cuda: no CUDA device is available")
    engine = Engine(state=initial, keep_events=False)
    try:
        executor = _executor(initial, model_config, device, swa_window, swa_layers,
                             mamba_config)
        executor.attach(engine)
    except ValueError as exc:
        return ExecutorReplay(False, f"--executor: {exc}")
    monitor = enable_integrity(executor, replayed=True)
    check = monitor.verify if full_checks else monitor.check
    applied = checked = checks = 0
    apply = engine.apply
    for event in stream:
        try:
            apply(event)
        except InvalidEvent as exc:
            return ExecutorReplay(False, f"replay stopped: {exc}", applied, checked)
        applied += 1
        if check_every and applied % check_every == 0:
            report = check()
            checks += 1
            checked += report.tokens_checked
            if not report.ok:
                return ExecutorReplay(False, f"after event #{applied - 1}: {report}", applied, checked)
    monitor.settle()  # the log ended: no decision is half done
    report = monitor.verify()
    checked += report.tokens_checked
    checks += 1
    if report.ok:
        kind = "full" if full_checks or not check_every else "incremental + 1 full"
        states = "" if monitor.mamba is None else " (Mamba states included)"
        message = (f"{applied} events replayed on {executor.device}; integrity ok in {checks} "
                   f"checks ({kind}): {checked} token reads matched their tags{states}")
    else:
        message = f"{applied} events replayed on {executor.device}; {report}"
    return ExecutorReplay(report.ok, message, applied, checked)


def _executor(initial: State, model_config: ModelConfig, device: str,
              swa_window: int | None, swa_layers: bool,
              mamba_config: MambaStateConfig | None) -> TorchExecutor:
    """Buffers for ``initial``'s geometry and pools; freed slots are poisoned so that a page
    or a state whose bytes should have been rewritten (a load, a copy) cannot pass by still
    holding its old tags."""
    import torch

    geometry = initial.geometry
    pages, size = geometry.num_pages, geometry.page_size
    mamba = initial.mamba if mamba_config is not None else None
    if initial.swa is None or not swa_layers:
        if mamba is None:
            return TorchExecutor(model_config, pages, size, dtype=torch.float16, device=device,
                                 poison_freed=True)
        assert mamba_config is not None
        return MambaTorchExecutor(model_config, mamba_config, pages, size, mamba.num_slots,
                                  dtype=torch.float16, device=device, poison_freed=True)
    full, swa = REPLAY_SWA_LAYERS
    if model_config.num_layers != len(full) + len(swa):
        model_config = attrs.evolve(model_config, num_layers=len(full) + len(swa))
    config = SwaModelConfig(model_config, full, swa, swa_window)
    if mamba is None:
        return SwaTorchExecutor(config, pages, size, initial.swa.num_pages, dtype=torch.float16,
                                device=device, poison_freed=True)
    assert mamba_config is not None
    return SwaMambaTorchExecutor(config, mamba_config, pages, size, initial.swa.num_pages,
                                 mamba.num_slots, dtype=torch.float16, device=device,
                                 poison_freed=True)


def _split_source(source: Any, events: Iterable[Event] | None) -> tuple[State, Iterable[Event]]:
    if isinstance(source, State):
        return source, (events if events is not None else ())
    if isinstance(source, tuple) and len(source) == 2 and isinstance(source[0], State):
        return source[0], source[1]
    if hasattr(source, "initial_state") and hasattr(source, "events"):
        return source.initial_state, (source.events if events is None else events)
    raise TypeError("replay_hook needs an Engine, a (State, events) pair or a State with events=")
