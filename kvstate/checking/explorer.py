"""Bounded breadth-first exploration and random walks over a search level.

BFS keeps, per fingerprint, only ``(parent fingerprint, step index)``; a
counterexample is rebuilt by re-expanding worlds from the initial one along
those indices (expansion order is deterministic), which also re-runs it from
the initial state and confirms it.  ALWAYS properties are checked on each
new world, TRANSITIONS (inside the level) on every edge, SOMETIMES probes on
every edge until each is hit.  A run stops at the first violation.

The explorer owns its own bookkeeping (dicts, a deque) and mutates nothing
it is given.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from kvstate.checking.levels import Level, Step

# ``progress(unique states, depth, edges)``: optional, called as the search goes (the CLI's bar).
ProgressHook = Callable[[int, int, int], None]


@attrs.frozen
class Violation:
    names: tuple[str, ...]
    messages: tuple[str, ...]
    path: tuple[Step, ...]  # labels and events from the initial world, in order

    def events(self) -> list[Any]:
        return [event for step in self.path for event in step.events]


@attrs.define
class Report:
    scope: str
    level: str
    mode: str
    unique_states: int = 0
    edges: int = 0
    max_depth: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # this process's CPU time (wall time suffers on a shared machine)
    sometimes_hit: dict[str, int] = attrs.field(factory=dict)
    sometimes_missed: list[str] = attrs.field(factory=list)
    violation: Violation | None = None
    log_path: str | None = None
    complete: bool = True  # False when a state limit cut the search short

    @property
    def states_per_second(self) -> float:
        return self.unique_states / self.seconds if self.seconds > 0 else 0.0

    @property
    def ok(self) -> bool:
        return self.violation is None and not self.sometimes_missed

    def as_json(self) -> dict[str, Any]:
        violations = []
        if self.violation is not None:
            from kvstate.events import event_record

            violations.append({
                "properties": list(self.violation.names),
                "messages": list(self.violation.messages),
                "events": [event_record(e) for e in self.violation.events()],
                "log": self.log_path,
            })
        return {
            "scope": self.scope, "level": self.level, "mode": self.mode,
            "unique_states": self.unique_states, "edges": self.edges,
            "max_depth": self.max_depth, "violations": violations,
            "sometimes_hit": dict(sorted(self.sometimes_hit.items())),
            "sometimes_missed": self.sometimes_missed, "seconds": round(self.seconds, 3),
            "states_per_second": round(self.states_per_second, 1),
            "cpu_seconds": round(self.cpu_seconds, 3), "complete": self.complete,
        }


def _always(level: Level, world: Any) -> list[tuple[str, str]]:
    from specs.invariants import check_state

    found = check_state(level.state(world))
    world_checks = getattr(level, "world_checks", None)
    if world_checks is not None:
        found += world_checks(world)
    return found


def _probes(level: Level, world: Any, step: Step, previous: tuple[Any, ...], pending: dict[str, Any],
            hits: dict[str, int]) -> None:
    from specs.invariants import Edge

    edge = Edge(level.state(world), step.events, level.state(step.world), previous)
    for name in list(pending):
        if pending[name](edge):
            hits[name] = hits.get(name, 0) + 1
            del pending[name]


def _rebuild(level: Level, indices: list[int]) -> tuple[Step, ...]:
    world = level.initial()
    path = []
    for index in indices:
        step = list(level.expand(world))[index]
        path.append(step)
        world = step.world
    return tuple(path)


def path_to(parent: Mapping[bytes, tuple[Any, ...]], fp: bytes) -> list[int]:
    """Step indices from the initial world to ``fp``; ``parent[fp]`` starts ``(parent fp, index)``."""
    indices: list[int] = []
    while True:
        up, index = parent[fp][:2]
        if up is None:
            return list(reversed(indices))
        indices.append(index)
        fp = up


def fail_report(level: Level, report: Report, indices: list[int], found: list[tuple[str, str]],
                unique_states: int, started: float, cpu_started: float) -> Report:
    """Finish ``report`` with the violation reached by step ``indices`` from the initial world.

    The path is rebuilt by re-running those steps, which confirms the counterexample.
    """
    path = _rebuild(level, indices)
    report.violation = Violation(tuple(dict.fromkeys(n for n, _ in found)),
                                 tuple(m for _, m in found), path)
    report.seconds = time.perf_counter() - started
    report.cpu_seconds = time.process_time() - cpu_started
    report.unique_states = unique_states
    return report


def explore(level: Level, *, max_depth: int | None = None, state_limit: int | None = None,
            probes: Iterable[str] | None = None, progress: ProgressHook | None = None) -> Report:
    """Exhaustive BFS up to ``max_depth`` (the scope's by default); ``probes``: the
    SOMETIMES probes to witness (the scope's by default); ``progress``: called with
    (unique states, depth, edges) as the search goes."""
    from specs.invariants import sometimes_probe

    scope = level.scope
    depth_bound = scope.max_depth if max_depth is None else max_depth
    names = list(scope.probes) if probes is None else list(probes)
    pending = {name: sometimes_probe(name) for name in names}
    hits: dict[str, int] = {}
    report = Report(scope.name, scope.level, "bfs")
    started = time.perf_counter()
    cpu_started = time.process_time()
    init = level.initial()
    init_fp = level.view(init)
    parent: dict[bytes, tuple[bytes | None, int, tuple[Any, ...]]] = {init_fp: (None, -1, ())}
    frontier: deque[tuple[Any, bytes, int]] = deque([(init, init_fp, 0)])

    def fail(indices: list[int], found: list[tuple[str, str]]) -> Report:
        return fail_report(level, report, indices, found, len(parent), started, cpu_started)

    found = _always(level, init)
    if found:
        return fail([], found)
    while frontier:
        world, fp, depth = frontier.popleft()
        report.max_depth = max(report.max_depth, depth)
        if progress is not None:
            progress(len(parent), depth, report.edges)
        if depth >= depth_bound:
            continue
        previous = parent[fp][2]
        for index, step in enumerate(level.expand(world)):
            report.edges += 1
            if step.violations:
                return fail(path_to(parent, fp) + [index], list(step.violations))
            if pending:
                _probes(level, world, step, previous, pending, hits)
            child_fp = level.view(step.world)
            if child_fp in parent:
                continue
            parent[child_fp] = (fp, index, step.events)
            found = _always(level, step.world)
            if found:
                return fail(path_to(parent, child_fp), found)
            frontier.append((step.world, child_fp, depth + 1))
            if state_limit is not None and len(parent) >= state_limit:
                report.complete = False
                frontier.clear()
                break
    report.seconds = time.perf_counter() - started
    report.cpu_seconds = time.process_time() - cpu_started
    report.unique_states = len(parent)
    report.sometimes_hit = hits
    report.sometimes_missed = sorted(pending)
    return report


def random_walks(level: Level, *, walks: int, depth: int, seed: int = 0,
                 probes: Iterable[str] | None = None, progress: ProgressHook | None = None) -> Report:
    """``walks`` seeded random walks of up to ``depth`` steps; counts distinct states seen."""
    from specs.invariants import sometimes_probe

    rng = random.Random(seed)
    names = list(level.scope.probes) if probes is None else list(probes)
    pending = {name: sometimes_probe(name) for name in names}
    hits: dict[str, int] = {}
    report = Report(level.scope.name, level.scope.level, f"walk(seed={seed})")
    started = time.perf_counter()
    cpu_started = time.process_time()
    seen: set[bytes] = set()
    for _ in range(walks):
        world = level.initial()
        indices: list[int] = []
        previous: tuple[Any, ...] = ()
        for _step in range(depth):
            steps = list(level.expand(world))
            report.edges += len(steps)
            for position, step in enumerate(steps):
                if step.violations:
                    return fail_report(level, report, [*indices, position], list(step.violations),
                                       len(seen), started, cpu_started)
            live = [i for i, s in enumerate(steps) if s.world is not None]
            if not live:
                break
            index = rng.choice(live)
            step = steps[index]
            if pending:
                _probes(level, world, step, previous, pending, hits)
            indices.append(index)
            fp = level.view(step.world)
            if fp not in seen:
                seen.add(fp)
                found = _always(level, step.world)
                if found:
                    return fail_report(level, report, indices, found, len(seen), started,
                                       cpu_started)
            world, previous = step.world, step.events
            report.max_depth = max(report.max_depth, len(indices))
        if progress is not None:
            progress(len(seen), report.max_depth, report.edges)
    report.seconds = time.perf_counter() - started
    report.cpu_seconds = time.process_time() - cpu_started
    report.unique_states = len(seen)
    report.sometimes_hit = hits
    report.sometimes_missed = sorted(pending)
    report.complete = False
    return report
