"""A seeded synthetic serving workload driven through the SGLang front end.

Tools-layer code (not the pure core): it owns a ``random.Random(seed)`` and
mutable scheduler bookkeeping.  Requests share a few system prompts, and
some continue an earlier conversation (prompt = earlier prompt + its output
+ new turn), so the radix cache gets real prefix hits, splits and
evictions.  The scheduler is a plain continuous-batching loop in SGLang's
order::

    admit:   pool.alloc(1), cache.match_prefix, inc_lock_ref, pool.write(prefix),
             plan_extend (evicts the page deficit), first output token
    decode:  plan_decode for every running request (on OOM the newest request
             finishes early), one output token each
    finish:  cache.cache_finished_req (insert, free the rest, close the row)

The same spec and seed always produce the same event stream.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

import attrs
import torch

from kvstate.engine import Engine
from kvstate.planner.alloc import plan_decode, plan_extend
from kvstate.sglang import (
    PagedTokenToKVPoolAllocator,
    RadixCache,
    Req,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from kvstate.state import Geometry


@attrs.frozen
class WorkloadSpec:
    """Shape of a synthetic run; every length is in tokens."""

    requests: int = 50
    seed: int = 0
    page_size: int = 1
    capacity: int = 1024
    max_running: int = 8
    system_prompts: int = 4
    system_len: tuple[int, int] = (16, 64)
    turn_len: tuple[int, int] = (4, 32)
    output_len: tuple[int, int] = (1, 24)
    continue_probability: float = 0.3
    vocab: int = 32000

    def __attrs_post_init__(self) -> None:
        if self.requests < 0 or self.max_running < 1 or self.page_size < 1:
            raise ValueError("requests >= 0, max_running >= 1 and page_size >= 1 are required")
        if self.capacity < self.row_width + self.page_size:
            raise ValueError(f"capacity {self.capacity} tokens cannot hold one request of up to "
                             f"{self.row_width} tokens; raise --capacity")

    @property
    def row_width(self) -> int:
        """Longest request: system prompt, two turns' worth of history, and output."""
        return self.system_len[1] + 4 * (self.turn_len[1] + self.output_len[1]) + self.page_size

    @property
    def geometry(self) -> Geometry:
        return Geometry(num_pages=self.capacity // self.page_size, page_size=self.page_size,
                        num_rows=self.max_running, row_width=self.row_width)


@attrs.define
class SyntheticRun:
    """The objects of a run, for inspection after :func:`run_synthetic` returns."""

    engine: Engine
    pool: ReqToTokenPool
    allocator: TokenToKVPoolAllocator
    cache: RadixCache
    finished: int = 0
    retracted: int = 0
    dropped: int = 0


def build_frontend(spec: WorkloadSpec, *, keep_events: bool = True) -> SyntheticRun:
    engine = Engine(Geometry(num_pages=1), keep_events=keep_events)
    pool = ReqToTokenPool(size=spec.max_running, max_context_len=spec.row_width, engine=engine)
    allocator: TokenToKVPoolAllocator
    if spec.page_size == 1:
        allocator = TokenToKVPoolAllocator(size=spec.capacity, engine=engine)
    else:
        pages = spec.capacity // spec.page_size
        allocator = PagedTokenToKVPoolAllocator(size=pages * spec.page_size,
                                                page_size=spec.page_size, engine=engine)
    cache = RadixCache(pool, allocator, page_size=spec.page_size, engine=engine)
    return SyntheticRun(engine, pool, allocator, cache)


HISTORY_LENGTH = 16


class _Prompts:
    """The prompt generator: system prompts, plus the last ``HISTORY_LENGTH`` finished prompts.

    A continuing request extends one of the most recent finished prompts, so
    only those are kept (a bounded deque, not every prompt of the run): a
    recording of any length runs in flat memory, and the draws, hence the
    recorded events, are exactly those of keeping them all.
    """

    def __init__(self, spec: WorkloadSpec, rng: random.Random) -> None:
        self.spec = spec
        self.rng = rng
        self.systems = [self.tokens(rng.randint(*spec.system_len)) for _ in range(spec.system_prompts)]
        self.history: deque[list[int]] = deque(maxlen=HISTORY_LENGTH)

    def tokens(self, count: int) -> list[int]:
        return [self.rng.randrange(1, self.spec.vocab) for _ in range(count)]

    def next_prompt(self) -> list[int]:
        spec, rng = self.spec, self.rng
        turn = self.tokens(rng.randint(*spec.turn_len))
        if self.history and rng.random() < spec.continue_probability:
            base = rng.choice(self.history)
            if len(base) + len(turn) + spec.output_len[1] + 1 <= spec.row_width:
                return base + turn
        return rng.choice(self.systems) + turn


def run_synthetic(spec: WorkloadSpec, *, attach: Callable[[SyntheticRun], None] | None = None,
                  keep_events: bool = True) -> SyntheticRun:
    """Run the workload to completion; ``attach(run)`` is called before the first event."""
    rng = random.Random(spec.seed)
    run = build_frontend(spec, keep_events=keep_events)
    if attach is not None:
        attach(run)
    prompts = _Prompts(spec, rng)
    waiting = deque(range(spec.requests))
    running: list[tuple[Req, int]] = []  # (request, target output length)
    at_head = spec.page_size > 1
    engine, cache = run.engine, run.cache

    def finish(req: Req) -> None:
        cache.cache_finished_req(req)
        prompts.history.append(req.fill_ids[:-1])
        run.finished += 1

    while waiting or running:
        while waiting and len(running) < spec.max_running:
            req = Req(f"r{waiting[0]}", prompts.next_prompt())
            if not _admit(run, req, at_head):
                if not running:
                    run.dropped += 1  # cannot fit even alone (all memory locked): skip it
                    waiting.popleft()
                    continue
                break
            waiting.popleft()
            req.output_ids.append(rng.randrange(1, spec.vocab))
            running.append((req, rng.randint(*spec.output_len)))
        for item in [item for item in running if len(item[0].output_ids) >= item[1]]:
            running.remove(item)
            finish(item[0])
        if not running:
            continue
        while running:
            with engine.batch() as batch:
                slots = plan_decode(batch, [int(r.req_pool_idx or 0) for r, _ in running],
                                    at_head=at_head)
            if slots is not None:
                break
            victim, _ = running.pop()  # out of memory: retract the newest request and retry
            finish(victim)
            run.retracted += 1
        for req, _ in running:
            req.output_ids.append(rng.randrange(1, spec.vocab))
    return run


def _admit(run: SyntheticRun, req: Req, at_head: bool) -> bool:
    """Row, prefix match, lock, prefix write, extend.  On OOM everything is undone."""
    rows = run.pool.alloc(1)
    if rows is None:
        return False
    row = rows[0]
    prompt = req.origin_input_ids
    slots, node = run.cache.match_prefix(prompt[:-1])
    run.cache.inc_lock_ref(node)
    if len(slots):
        run.pool.write((row, slice(0, len(slots))), slots)
    with run.engine.batch() as batch:
        extended = plan_extend(batch, [(row, len(prompt))], at_head=at_head)
    if extended is None:
        run.cache.dec_lock_ref(node)
        run.pool.free(row)
        return False
    req.req_pool_idx = row
    req.prefix_indices = slots if len(slots) else torch.empty((0,), dtype=torch.int64)
    req.last_node = node
    return True
