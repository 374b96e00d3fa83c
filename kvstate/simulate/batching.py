"""Continuous batching over the trace's arrival times, with a ``max_running`` bound.

Drives a ``TraceSimulator`` (radix planner) or a ``VllmTraceSimulator``
(vLLM's block pool); both offer ``admit``, ``extend_active`` and ``finish``.

Time advances in decode iterations of ``step_ms`` milliseconds (a model
parameter: the trace does not say how fast the engine was).  Each iteration:

1. requests whose arrival time has come join the waiting queue (stream order);
2. waiting requests are admitted in order while fewer than ``max_running``
   run and the pool can hold the prompt (``TraceSimulator.admit``); the first
   one that does not fit *waits* (counted once) and blocks those behind it.
   A request that does not fit even when nothing else runs is rejected;
3. every running request decodes one token; a request whose next token
   needs a page the pool cannot give is *retracted*: it finishes at once,
   caching its prompt only;
4. requests that produced all their output finish (caching per settings).

With nothing running and nobody waiting, the clock jumps to the next
arrival.  A prefix is only in the cache once the request that wrote it has
finished, so overlapping requests that share a prefix miss where a
one-at-a-time replay would hit (under ``vllm`` a prompt block is cached as
soon as it is computed, so a later request can share it while the writer still
runs, as in vLLM).  The simulator mutates only itself and the simulator it drives.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kvstate.simulate.driver import ProgressCallback, TraceSimulator
from kvstate.simulate.settings import SimulationResult, check_batching
from kvstate.traces.records import TraceRequest

if TYPE_CHECKING:
    from kvstate.simulate.vllm_driver import VllmTraceSimulator


class _Running:
    __slots__ = ("active", "tokens_done", "length")

    def __init__(self, active: Any) -> None:
        self.active = active
        self.tokens_done = 0
        self.length = active.prompt_units  # key units allocated so far


class BatchingSimulator:
    """Drives a ``TraceSimulator`` with arrival times, ``max_running`` and a step time."""

    def __init__(
        self, simulator: TraceSimulator | VllmTraceSimulator, max_running: int, step_ms: float
    ) -> None:
        check_batching(max_running, step_ms)
        self.simulator = simulator
        self.max_running = max_running
        self.step_s = step_ms / 1000.0

    def _target_length(self, run: _Running) -> int:
        """Key units the request needs after ``tokens_done`` output tokens."""
        simulator = self.simulator
        active = run.active
        if simulator.settings.granularity == "token":
            return active.prompt_units + run.tokens_done
        total = -(-(active.request.prompt_length + run.tokens_done) // simulator.unit_tokens)
        return max(active.prompt_units, total)

    def run(
        self,
        requests: Iterable[TraceRequest],
        request_count: int,
        progress: ProgressCallback | None = None,
    ) -> SimulationResult:
        sim = self.simulator
        counters = sim.counters
        decode = sim.settings.decode
        first_measured = math.floor(request_count * sim.settings.warmup)
        pending = iter(enumerate(requests))
        upcoming = next(pending, None)
        waiting: deque[tuple[int, TraceRequest]] = deque()
        waited: set[int] = set()
        running: list[_Running] = []
        now = 0.0
        finished = 0
        while upcoming is not None or waiting or running:
            while upcoming is not None and upcoming[1].arrival_s <= now:
                waiting.append(upcoming)
                counters.requests += 1
                upcoming = next(pending, None)
            if not waiting and not running:
                assert upcoming is not None
                now = upcoming[1].arrival_s
                continue
            while waiting and len(running) < self.max_running:
                index, request = waiting[0]
                measured = index >= first_measured
                active = sim.admit(index, request, measured, count_if_refused=not running)
                if active is None:
                    if running:
                        if index not in waited:
                            waited.add(index)
                            counters.waited += 1
                        break
                    counters.rejected += 1
                    waiting.popleft()
                    finished += 1
                    continue
                waiting.popleft()
                running.append(_Running(active))
            still: list[_Running] = []
            for run in running:
                if decode and run.tokens_done < run.active.request.output_length:
                    run.tokens_done += 1
                    target = self._target_length(run)
                    if target > run.length:
                        if sim.extend_active(run.active, target):
                            run.length = target
                        else:
                            counters.retracted += 1
                            sim.finish(run.active, 0)
                            finished += 1
                            continue
                if not decode or run.tokens_done >= run.active.request.output_length:
                    sim.finish(run.active, run.length - run.active.prompt_units)
                    finished += 1
                    continue
                still.append(run)
            running = still
            if progress is not None and finished and finished % 256 == 0:
                progress(finished)
            now += self.step_s
        if progress is not None:
            progress(finished)
        return sim.result()
