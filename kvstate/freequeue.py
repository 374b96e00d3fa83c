"""A persistent (immutable, structurally shared) ordered queue of free pages.

Engines order free pages differently and the order decides which page the
next allocation gets:

* SGLang's token allocator takes from the head and appends frees at the tail;
* SGLang's paged allocator takes from the head and prepends frees;
* vLLM takes from the head and puts hashed blocks at the tail, others at the head.

``FreeQueue`` supports all of them in O(k log n) for k pages: ``push_head``,
``push_tail``, ``take`` (remove named pages, wherever they sit) and ``head``.

Representation::

    front: cons list of (order_key, page), ascending keys   <- head of queue
    back:  cons list of (order_key, page), descending keys  <- tail of queue
    keys:  immutables.Map page -> order_key (membership and liveness)

An entry in ``front``/``back`` is live only while ``keys[page]`` still equals
its key; removing a page from the middle just deletes it from ``keys`` and the
stale entry is skipped (and dropped) later.  Head pushes use keys below every
existing key and tail pushes keys above, so key order *is* queue order.
Nothing here mutates: every operation returns a new queue.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import attrs
from immutables import Map

# A cons cell is (order_key, page, rest) or None.
Cons = tuple[int, int, Any] | None


def _cons_from(entries: Iterable[tuple[int, int]], tail: Cons = None) -> Cons:
    """Build a cons list whose first element is the *last* entry given."""
    cell = tail
    for key, page in entries:
        cell = (key, page, cell)
    return cell


@attrs.frozen
class FreeQueue:
    front: Cons
    back: Cons
    keys: Map[int, int]
    head_key: int  # next key for a head push (decreasing)
    tail_key: int  # next key for a tail push (increasing)

    @classmethod
    def from_pages(cls, pages: Iterable[int]) -> FreeQueue:
        ordered = list(pages)
        keyed = [(index, page) for index, page in enumerate(ordered)]
        front = _cons_from(reversed(keyed))
        keys = Map({page: index for index, page in keyed})
        if len(keys) != len(ordered):
            raise ValueError("duplicate page in initial free queue")
        return cls(front, None, keys, -1, len(ordered))

    def __len__(self) -> int:
        return len(self.keys)

    def __contains__(self, page: object) -> bool:
        return page in self.keys

    def __iter__(self) -> Iterator[int]:
        """Live pages in queue order, head first.  O(n + stale)."""
        keys = self.keys
        cell = self.front
        while cell is not None:
            key, page, cell = cell
            if keys.get(page) == key:
                yield page
        back_entries = []
        cell = self.back
        while cell is not None:
            key, page, cell = cell
            if keys.get(page) == key:
                back_entries.append(page)
        yield from reversed(back_entries)

    def head(self, count: int) -> list[int]:
        """The first ``count`` live pages (fewer if the queue is shorter)."""
        out: list[int] = []
        if count <= 0:
            return out
        for page in self:
            out.append(page)
            if len(out) == count:
                break
        return out

    def push_tail(self, pages: Iterable[int]) -> FreeQueue:
        """Append ``pages`` in the given order.  Caller guarantees they are not queued."""
        key = self.tail_key
        back = self.back
        with self.keys.mutate() as keys:
            for page in pages:
                back = (key, page, back)
                keys[page] = key
                key += 1
            new_keys = keys.finish()
        return FreeQueue(self.front, back, new_keys, self.head_key, key)

    def push_head(self, pages: Iterable[int]) -> FreeQueue:
        """Prepend ``pages`` so that ``pages[0]`` becomes the new head."""
        ordered = list(pages)
        key = self.head_key
        front = self.front
        with self.keys.mutate() as keys:
            for page in reversed(ordered):
                front = (key, page, front)
                keys[page] = key
                key -= 1
            new_keys = keys.finish()
        return FreeQueue(front, self.back, new_keys, key, self.tail_key)

    def take(self, pages: Iterable[int]) -> FreeQueue:
        """Remove ``pages`` (each must be queued) and drop stale head entries."""
        with self.keys.mutate() as keys:
            for page in pages:
                del keys[page]
            new_keys = keys.finish()
        front, back = _drop_stale(self.front, self.back, new_keys)
        return FreeQueue(front, back, new_keys, self.head_key, self.tail_key)


def _drop_stale(front: Cons, back: Cons, keys: Map[int, int]) -> tuple[Cons, Cons]:
    """Skip dead entries at the head; refill ``front`` from ``back`` when empty.

    Allocation takes from the head, so the dead entries it leaves are always
    here; dropping them keeps ``head`` O(k) along one history.
    """
    while True:
        while front is not None and keys.get(front[1]) != front[0]:
            front = front[2]
        if front is not None or back is None:
            return front, back
        entries = []
        cell = back
        while cell is not None:
            key, page, cell = cell
            if keys.get(page) == key:
                entries.append((key, page))
        front = _cons_from(entries)  # back is newest-first, so this is ascending
        back = None
