"""A measurement prototype for issue 13's open design decision: page-indexed arrays and a
compiled live path, on the vLLM pool's allocate + free.

Not used by kvstate.  It answers one question with numbers: what would the
pool micro-operations cost if the live backend kept its page maps in
page-indexed lists (a free queue linked through two int lists, as vLLM's is
linked through its block objects; holders and tree links per page) instead of
dicts and ``OrderedDict``s, and if that path were compiled with mypyc?  The
prototype keeps everything that makes kvstate's call a *fact*: the planner
decides, a ``BlockAlloc`` / ``BlockRelease`` event (the real msgspec
classes) is built, the rule checks every precondition before it writes (the
pages are the queue's head; none is cached; each released page is held by
the caller; no page twice), the event is journalled and a listener sees the
batch.  Only the pool-level (``DETACHED``) holder and the two events the
benchmark drives are covered.

Run it interpreted, or compile it first (the ``.so`` lands beside this file;
delete it afterwards)::

    python tools/proto_array_pool.py 16 1024          # ns per block, interpreted
    mypyc tools/proto_array_pool.py && python tools/proto_array_pool.py 16 1024

``tools/count_instructions.py`` style counts for the doc were taken by
running ``python -c "import proto_array_pool as p; p.loop(p.ArrayPool(100_000), K, N)"`` under
valgrind with two values of ``N``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from kvstate.events import BlockAlloc, BlockRelease, Event

NO_NODE = -1


class Refused(Exception):
    """A rule's precondition failed; nothing was written."""


class ArrayQueue:
    """The free queue linked through ``succ`` / ``pred`` (index 0, the null page, is the
    sentinel: ``succ[0]`` is the head, ``pred[0]`` the tail); ``queued[p]`` for membership."""

    def __init__(self, num_pages: int) -> None:
        size = num_pages + 1
        self.succ: list[int] = [(page + 1) % size for page in range(size)]
        self.pred: list[int] = [(page - 1) % size for page in range(size)]
        self.queued: list[bool] = [page != 0 for page in range(size)]
        self.length = num_pages

    def head(self, count: int) -> list[int]:
        succ = self.succ
        out: list[int] = []
        page = succ[0]
        while len(out) < count and page != 0:
            out.append(page)
            page = succ[page]
        return out

    def take_head(self, pages: tuple[int, ...]) -> None:
        """Remove ``pages``, which must be the head in order (checked before any write)."""
        succ = self.succ
        page = succ[0]
        for wanted in pages:
            if wanted != page:
                raise Refused(f"pages {list(pages)} are not the head of the free queue")
            page = succ[page]
        queued = self.queued
        for taken in pages:
            queued[taken] = False
        succ[0] = page
        self.pred[page] = 0
        self.length -= len(pages)

    def push_head(self, pages: list[int]) -> None:
        """``pages[0]`` becomes the head (none of them is queued)."""
        succ, pred, queued = self.succ, self.pred, self.queued
        first = succ[0]
        previous = 0
        for page in pages:
            succ[previous] = page
            pred[page] = previous
            queued[page] = True
            previous = page
        succ[previous] = first
        pred[first] = previous
        self.length += len(pages)

    def push_tail(self, pages: list[int]) -> None:
        succ, pred, queued = self.succ, self.pred, self.queued
        previous = pred[0]
        for page in pages:
            succ[previous] = page
            pred[page] = previous
            queued[page] = True
            previous = page
        succ[previous] = 0
        pred[0] = previous
        self.length += len(pages)


class ArrayState:
    """Holders and tree links per page in lists (an empty tuple: not held)."""

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self.free_pages = ArrayQueue(num_pages)
        self.holders: list[tuple[int, ...]] = [() for _ in range(num_pages + 1)]
        self.page_node: list[int] = [NO_NODE] * (num_pages + 1)
        self.seq = 0


DETACHED_HOLD = (0,)


def block_alloc(s: ArrayState, event: BlockAlloc) -> None:
    pages: tuple[int, ...] = event.pages
    if event.holder != 0:
        raise Refused("the prototype covers the pool-level holder only")
    page_node = s.page_node
    for page in pages:  # the head check below also rules out a page outside the pool
        if 0 < page <= s.num_pages and page_node[page] != NO_NODE:
            raise Refused(f"page {page} is still cached")
    s.free_pages.take_head(pages)
    holders = s.holders
    for page in pages:
        holders[page] = DETACHED_HOLD


def block_release(s: ArrayState, event: BlockRelease) -> None:
    pages: tuple[int, ...] = event.pages
    holder = event.holder
    if len(set(pages)) != len(pages):
        raise Refused("a page is released twice in one event (double free)")
    holders, num_pages = s.holders, s.num_pages
    for page in pages:
        if not 0 < page <= num_pages or holder not in holders[page]:
            raise Refused(f"page {page} is not held by {holder}")
    to_head: list[int] = []
    to_tail: list[int] = []
    cached_to_tail: bool = event.cached_to_tail
    page_node = s.page_node
    for page in pages:
        held = holders[page]
        if len(held) > 1:
            index = held.index(holder)
            holders[page] = held[:index] + held[index + 1:]
        else:
            holders[page] = ()
            if cached_to_tail and page_node[page] != NO_NODE:
                to_tail.append(page)
            else:
                to_head.append(page)
    if to_head:
        s.free_pages.push_head(to_head)
    if to_tail:
        s.free_pages.push_tail(to_tail)


class ArrayEngine:
    """One batch per call: the rule checks and applies, the event is journalled, listeners
    see the batch when it closes."""

    def __init__(self, num_pages: int) -> None:
        self.state = ArrayState(num_pages)
        self.journal: list[Event] = []
        self.batch_events: list[Event] = []
        self.listeners: list[Any] = []

    def emit(self, event: Event) -> None:
        kind = type(event)
        if kind is BlockAlloc:
            block_alloc(self.state, event)  # type: ignore[arg-type]
        elif kind is BlockRelease:
            block_release(self.state, event)  # type: ignore[arg-type]
        else:
            raise Refused(f"no rule for {kind.__name__}")
        self.state.seq += 1
        self.batch_events.append(event)

    def close(self) -> None:
        events, self.batch_events = self.batch_events, []
        self.journal.extend(events)
        if len(self.journal) > 4096:  # a bounded journal, as the engine's is
            del self.journal[:2048]
        for listener in self.listeners:
            listener.after(events, self.state)


class Listener:
    """Looks at every event of a batch (the vLLM front end's hash listener does)."""

    def __init__(self) -> None:
        self.seen = 0

    def after(self, events: list[Event], view: ArrayState) -> None:
        for event in events:
            if type(event) is not BlockAlloc and type(event) is not BlockRelease:
                self.seen += 1


class BlockView:
    __slots__ = ("block_id",)

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id


class ArrayPool:
    """``get_new_blocks`` / ``free_blocks`` on the prototype engine."""

    def __init__(self, num_gpu_blocks: int) -> None:
        self.engine = ArrayEngine(num_gpu_blocks - 1)
        self.engine.listeners.append(Listener())
        self.blocks = [BlockView(block_id) for block_id in range(num_gpu_blocks)]

    def get_new_blocks(self, num_blocks: int) -> list[BlockView]:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
            raise ValueError(f"num_blocks must be an int >= 0, got {num_blocks!r}")
        engine = self.engine
        queue = engine.state.free_pages
        if num_blocks > queue.length:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        pages = queue.head(num_blocks)
        page_node = engine.state.page_node
        for page in pages:
            if page_node[page] != NO_NODE:
                raise Refused("the prototype does not plan lazy eviction")
        try:
            engine.emit(BlockAlloc(0, tuple(pages)))
        finally:
            engine.close()
        blocks = self.blocks
        return [blocks[page] for page in pages]

    def free_blocks(self, ordered_blocks: list[BlockView]) -> None:
        blocks = self.blocks
        ids = [block.block_id for block in ordered_blocks]
        for block_id, block in zip(ids, ordered_blocks, strict=True):
            if blocks[block_id] is not block:
                raise TypeError(f"{block!r} is not a block of this pool")
        engine = self.engine
        try:
            engine.emit(BlockRelease(0, tuple([i for i in ids if i != 0]), True, False))
        finally:
            engine.close()


def loop(pool: ArrayPool, count: int, repetitions: int) -> None:
    for _ in range(repetitions):
        pool.free_blocks(pool.get_new_blocks(count))


def main(argv: list[str]) -> None:
    for count in [int(arg) for arg in argv] or [16, 1024]:
        repetitions = max(20, 200_000 // count)
        best = float("inf")
        pool = ArrayPool(100_000)
        for _ in range(5):
            start = time.process_time()
            loop(pool, count, repetitions)
            best = min(best, time.process_time() - start)
        print(f"alloc+free x{count}: {best / repetitions / count * 1e9:,.0f} ns per block")


if __name__ == "__main__":
    main(sys.argv[1:])
