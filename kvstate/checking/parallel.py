"""Breadth-first exploration on several processes: the same search as ``explorer.explore``.

The search is level-synchronous.  Each worker process (forked, so it shares
the level object) keeps the worlds *it* generated, and mostly fingerprints
cross the pipes::

    parent                               worker i
    ------                               --------
    new states of depth d, by worker ->  ALWAYS on each; expand each (edge checks,
                                         SOMETIMES probes); keep every child world
                                     <-  (parent fp, step index, child fp) per edge
    first sight of a child fp wins and
    it joins level d+1 at the worker
    that made it; a worker with more
    than its share exports the surplus
    (pickled worlds) to the others

A level goes out in rounds of ``round_size`` states per worker.  A state's
depth is the level at which it is first seen, in any order of expansion, so
a complete run finds exactly the unique states, edges and depth of the
sequential explorer (the pinned counts hold); which of two equal-length
paths a counterexample takes may differ.  With a state limit the search
stops at the end of the round that reaches it, so it may expand up to a
round more than the sequential explorer.  The parent owns the fingerprint
table and the report; a worker owns only its worlds.
"""

from __future__ import annotations

import multiprocessing
import pickle
import time
from collections.abc import Iterable
from multiprocessing.connection import Connection
from typing import Any

from kvstate.checking.explorer import ProgressHook, Report, _always, _probes, fail_report, path_to
from kvstate.checking.levels import Level

Edge = tuple[bytes, int, bytes]  # parent fp, step index, child fp


def _worker(level: Level, conn: Connection, names: list[str]) -> None:
    """Run :func:`_serve`; an unexpected exception goes back to the parent as text."""
    try:
        _serve(level, conn, names)
    except Exception:  # the parent re-raises it; a bare crash would only show as EOFError
        import traceback

        conn.send(("crash", traceback.format_exc()))


def _serve(level: Level, conn: Connection, names: list[str]) -> None:
    """Serve requests until told to stop.  Mutates only its own dict of worlds."""
    from specs.invariants import sometimes_probe

    init = level.initial()
    # worlds: this level's states held here; children: the next level's, as they are made
    worlds: dict[bytes, tuple[Any, tuple[Any, ...]]] = {level.view(init): (init, ())}
    children: dict[bytes, tuple[Any, tuple[Any, ...]]] = {}
    while True:
        message = conn.recv()
        if message is None:
            return
        if message[0] == "export":
            conn.send([(fp, pickle.dumps(worlds.pop(fp), protocol=pickle.HIGHEST_PROTOCOL))
                       for fp in message[1]])
            continue
        if message[0] == "advance":
            worlds, children = children, {}
            conn.send(len(worlds))
            continue
        _, assigned, incoming, expand, pending_names = message
        for fp, blob in incoming:
            worlds[fp] = pickle.loads(blob)
        pending = {name: sometimes_probe(name) for name in pending_names if name in names}
        hits: dict[str, int] = {}
        edges: list[Edge] = []
        failure: tuple[Any, ...] | None = None
        count = 0
        for fp in assigned:
            world, previous = worlds[fp]
            found = _always(level, world)
            if found:
                failure = ("always", fp, found)
                break
            if not expand:
                continue
            for index, step in enumerate(level.expand(world)):
                count += 1
                if step.violations:
                    failure = ("edge", fp, index, list(step.violations))
                    break
                if pending:
                    _probes(level, world, step, previous, pending, hits)
                child_fp = level.view(step.world)
                edges.append((fp, index, child_fp))
                children.setdefault(child_fp, (step.world, step.events))
            if failure is not None:
                break
        conn.send((failure, count, hits, edges))


def _admit(answers: list[Any], parent: dict[bytes, Any], made: list[list[bytes]],
           state_limit: int | None) -> bool:
    """Register first-seen children (worker order, then edge order); True at the state limit."""
    for owner, (_, _, _, edges) in enumerate(answers):
        for up, index, child in edges:
            if child in parent:
                continue
            parent[child] = (up, index)
            made[owner].append(child)
            if state_limit is not None and len(parent) >= state_limit:
                return True
    return False


def _balance(made: list[list[bytes]]) -> tuple[list[list[bytes]], list[list[tuple[int, bytes]]]]:
    """Owners for the next level: each worker keeps up to an even share of the states it made.

    Returns the per-worker frontier and, per maker, the ``(new owner, fp)`` moves.
    """
    workers = len(made)
    share = -(-sum(len(fps) for fps in made) // workers)
    frontier = [fps[:share] for fps in made]
    moves: list[list[tuple[int, bytes]]] = [[] for _ in range(workers)]
    receiver = 0
    for maker, fps in enumerate(made):
        for fp in fps[share:]:
            while len(frontier[receiver]) >= share:
                receiver += 1
            frontier[receiver].append(fp)
            moves[maker].append((receiver, fp))
    return frontier, moves


def explore_parallel(level: Level, *, workers: int = 2, max_depth: int | None = None,
                     state_limit: int | None = None, probes: Iterable[str] | None = None,
                     round_size: int = 512, progress: ProgressHook | None = None) -> Report:
    """Exhaustive BFS like :func:`kvstate.checking.explorer.explore`, on ``workers`` processes."""

    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    scope = level.scope
    depth_bound = scope.max_depth if max_depth is None else max_depth
    names = list(scope.probes) if probes is None else list(probes)
    pending = list(names)
    hits: dict[str, int] = {}
    report = Report(scope.name, scope.level, f"bfs({workers} workers)")
    started, cpu_started = time.perf_counter(), time.process_time()
    init_fp = level.view(level.initial())
    parent: dict[bytes, tuple[bytes | None, int]] = {init_fp: (None, -1)}
    cpu_before = _children_cpu()
    context = multiprocessing.get_context("fork")
    pipes, processes = [], []
    for _ in range(workers):
        here, there = context.Pipe()
        process = context.Process(target=_worker, args=(level, there, names), daemon=True)
        process.start()
        pipes.append(here)
        processes.append(process)

    # Every worker starts holding the initial world; worker 0 is its owner.
    frontier: list[list[bytes]] = [[init_fp]] + [[] for _ in range(workers - 1)]
    incoming: list[list[tuple[bytes, bytes]]] = [[] for _ in range(workers)]
    depth = 0
    cut = False
    cpu_children = 0.0  # the workers' CPU time, added once they have exited
    try:
        while any(frontier) and not cut:
            report.max_depth = depth
            expand = depth < depth_bound
            made: list[list[bytes]] = [[] for _ in range(workers)]
            # A level goes out in rounds, so a state limit stops the search within a round.
            for start in range(0, max(len(fps) for fps in frontier), round_size):
                for pipe, fps, adopted in zip(pipes, frontier, incoming, strict=True):
                    pipe.send(("expand", fps[start:start + round_size], adopted if start == 0 else [],
                               expand, pending))
                answers = [_receive(pipe) for pipe in pipes]
                for failure, count, found_hits, _edges in answers:
                    report.edges += count
                    if failure is not None:
                        return _fail(level, report, parent, failure, started, cpu_started)
                    hits.update((name, 1) for name in found_hits if name in pending)
                pending = [name for name in pending if name not in hits]
                cut = _admit(answers, parent, made, state_limit)
                if progress is not None:
                    progress(len(parent), depth, report.edges)
                if cut:
                    break
            for pipe in pipes:
                pipe.send(("advance",))
            for pipe in pipes:
                _receive(pipe)
            if cut:
                # ALWAYS still runs on the states admitted before the cut, as sequentially.
                for pipe, fps in zip(pipes, made, strict=True):
                    pipe.send(("expand", fps, [], False, []))
                for failure, *_ in (_receive(pipe) for pipe in pipes):
                    if failure is not None:
                        return _fail(level, report, parent, failure, started, cpu_started)
                report.complete = False
                break
            frontier, moves = _balance(made)
            incoming = [[] for _ in range(workers)]
            for maker, moved in enumerate(moves):
                if moved:
                    pipes[maker].send(("export", [fp for _, fp in moved]))
                    blobs = dict(_receive(pipes[maker]))
                    for receiver, fp in moved:
                        incoming[receiver].append((fp, blobs[fp]))
            depth += 1
    finally:
        for pipe in pipes:
            try:
                pipe.send(None)
            except OSError:  # that worker has already exited
                pass
        for process in processes:
            process.join(timeout=10)
        cpu_children = _children_cpu() - cpu_before
    report.seconds = time.perf_counter() - started
    report.cpu_seconds = time.process_time() - cpu_started + cpu_children
    report.unique_states = len(parent)
    report.sometimes_hit = hits
    report.sometimes_missed = sorted(set(names) - set(hits))
    return report


def _receive(pipe: Connection) -> Any:
    answer = pipe.recv()
    if isinstance(answer, tuple) and answer and answer[0] == "crash":
        raise RuntimeError(f"an explorer worker failed:\n{answer[1]}")
    return answer


def _fail(level: Level, report: Report, parent: dict[bytes, Any],
          failure: tuple[Any, ...], started: float, cpu_started: float) -> Report:
    if failure[0] == "always":
        _, fp, found = failure
        indices = path_to(parent, fp)
    else:
        _, fp, index, found = failure
        indices = path_to(parent, fp) + [index]
    return fail_report(level, report, indices, found, len(parent), started, cpu_started)


def _children_cpu() -> float:
    """CPU seconds of this process's finished children (the workers), for the report."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
