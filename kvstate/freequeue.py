"""Free queues: the ordered set of free pages (or rows), in two representations.

Engines order free pages differently, and the order decides which page the
next allocation gets:

* SGLang's token allocator takes from the head and appends frees at the tail;
* SGLang's paged allocator takes from the head and prepends frees;
* vLLM takes from the head, puts cached blocks at the tail and others at the head.

Both representations support all of them: ``push_head``, ``push_tail``,
``take`` (remove named items wherever they sit), ``head``, membership, length
and iteration in queue order.  Queue order is::

    head-pushed items (newest push first) | untouched initial range | tail-pushed items

The initial range ``lo..hi-1`` costs no memory per item: a queue of 10^8
free pages is three integers until items are taken from its middle (those
become ``holes``, and ``lo`` skips past them as the head moves on).

``FreeQueue`` is persistent (every operation returns a new queue and never
changes the old one; frozen states hold it).  ``LiveQueue`` changes itself
in place at O(1) per item (the live engine holds it).  The rules call the
same method names on both and always store the result back, so one rule
text serves both: ``s.free_pages = s.free_pages.take(pages)``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from itertools import filterfalse, islice
from typing import Any

import attrs
from immutables import Map

# A cons cell is (order_key, item, rest) or None.
Cons = tuple[int, int, Any] | None


def _cons_from(entries: Iterable[tuple[int, int]], tail: Cons = None) -> Cons:
    """A cons list whose first cell is the *last* entry given."""
    cell = tail
    for key, item in entries:
        cell = (key, item, cell)
    return cell


@attrs.frozen
class FreeQueue:
    """Persistent free queue: ``front`` + range ``[lo, hi)`` minus ``holes`` + ``back``.

    ``front`` holds head-pushed items with ascending order keys (all below the
    range), ``back`` tail-pushed items with descending keys (all above it).
    An entry of a cons list is live only while ``keys[item]`` equals its key,
    so removing an item from the middle is a map delete; dead entries are
    dropped when the head reaches them.
    """

    front: Cons
    back: Cons
    keys: Map[int, int]  # explicit (pushed) live items -> order key
    lo: int  # the untouched range lo..hi-1, minus holes
    hi: int
    holes: Map[int, None]  # range items taken out of order (all within lo..hi-1)
    head_key: int  # next key for a head push (decreasing, below every key)
    tail_key: int  # next key for a tail push (increasing, above every key)
    desc: bool = False  # the range is handed out from hi-1 down (request rows)

    @classmethod
    def from_range(cls, lo: int, hi: int, *, desc: bool = False) -> FreeQueue:
        """Items ``lo..hi-1`` in ascending order (``desc``: descending), in O(1) memory."""
        hi = max(hi, lo)
        return cls(None, None, Map(), lo, hi, Map(), -1, hi - lo, desc)

    @classmethod
    def from_items(cls, items: Iterable[int]) -> FreeQueue:
        """Items in the given order (explicit entries; duplicates are refused)."""
        ordered = list(items)
        keyed = list(enumerate(ordered))
        keys = Map({item: key for key, item in keyed})
        if len(keys) != len(ordered):
            raise ValueError("duplicate item in a free queue")
        return cls(_cons_from(reversed(keyed)), None, keys, 0, 0, Map(), -1, len(ordered))

    def __len__(self) -> int:
        return len(self.keys) + (self.hi - self.lo) - len(self.holes)

    def __contains__(self, item: object) -> bool:
        if item in self.keys:
            return True
        return isinstance(item, int) and self.lo <= item < self.hi and item not in self.holes

    def __iter__(self) -> Iterator[int]:
        """Live items in queue order, head first."""
        keys = self.keys
        cell = self.front
        while cell is not None:
            key, item, cell = cell
            if keys.get(item) == key:
                yield item
        holes = self.holes
        for item in _range(self.lo, self.hi, self.desc):
            if item not in holes:
                yield item
        back_items = []
        cell = self.back
        while cell is not None:
            key, item, cell = cell
            if keys.get(item) == key:
                back_items.append(item)
        yield from reversed(back_items)

    def head(self, count: int) -> list[int]:
        """The first ``count`` live items (fewer if the queue is shorter)."""
        return list(islice(self, max(count, 0)))

    def missing(self, items: Sequence[int]) -> int | None:
        """The first of ``items`` that is not queued, or ``None``."""
        for item in items:
            if item not in self:
                return item
        return None

    def push_tail(self, items: Iterable[int]) -> FreeQueue:
        """Append ``items`` in order (the caller guarantees none is queued)."""
        key = self.tail_key
        back = self.back
        with self.keys.mutate() as keys:
            for item in items:
                back = (key, item, back)
                keys[item] = key
                key += 1
            new_keys = keys.finish()
        return attrs.evolve(self, back=back, keys=new_keys, tail_key=key)

    def push_head(self, items: Sequence[int]) -> FreeQueue:
        """Prepend ``items`` so that ``items[0]`` becomes the new head."""
        key = self.head_key
        front = self.front
        with self.keys.mutate() as keys:
            for item in reversed(items):
                front = (key, item, front)
                keys[item] = key
                key -= 1
            new_keys = keys.finish()
        return attrs.evolve(self, front=front, keys=new_keys, head_key=key)

    def take_head(self, items: Sequence[int]) -> FreeQueue:
        """Remove ``items``, which are the queue's head (``head(len(items))``)."""
        return self.take(items)

    def take(self, items: Iterable[int]) -> FreeQueue:
        """Remove ``items`` (each must be queued) and drop dead entries at the head."""
        lo, hi, desc = self.lo, self.hi, self.desc
        with self.keys.mutate() as keys, self.holes.mutate() as holes:
            for item in items:
                if item in keys:
                    del keys[item]
                elif not desc and item == lo:
                    lo += 1
                elif desc and item == hi - 1:
                    hi -= 1
                else:
                    holes[item] = None
            if holes:  # the head moved onto earlier holes
                lo, hi = _skip_holes(lo, hi, desc, holes)
            new_keys, new_holes = keys.finish(), holes.finish()
        front, back = self.front, self.back
        while front is not None and new_keys.get(front[1]) != front[0]:
            front = front[2]
        if front is None and lo >= hi and back is not None:
            front, back = _refill(back, new_keys), None
        return attrs.evolve(self, front=front, back=back, keys=new_keys, lo=lo, hi=hi,
                            holes=new_holes)

    def thaw(self) -> LiveQueue:
        """A ``LiveQueue`` with the same items in the same order."""
        live = LiveQueue(self.lo, self.hi, desc=self.desc)
        live.holes.update(dict.fromkeys(self.holes.keys()))
        keys = self.keys
        cell = self.front
        front_items = []
        while cell is not None:
            key, item, cell = cell
            if keys.get(item) == key:
                front_items.append(item)
        live.front.update(dict.fromkeys(reversed(front_items)))
        back_items = []
        cell = self.back
        while cell is not None:
            key, item, cell = cell
            if keys.get(item) == key:
                back_items.append(item)
        live.back.update(dict.fromkeys(reversed(back_items)))
        return live


def _range(lo: int, hi: int, desc: bool) -> range:
    return range(hi - 1, lo - 1, -1) if desc else range(lo, hi)


def _skip_holes(lo: int, hi: int, desc: bool, holes: Any) -> tuple[int, int]:
    """Advance the range's head past holes (dropping them); works on a set or a mutation."""
    if desc:
        while lo < hi and (hi - 1) in holes:
            del holes[hi - 1]
            hi -= 1
    else:
        while lo < hi and lo in holes:
            del holes[lo]
            lo += 1
    return lo, hi


def _refill(back: Cons, keys: Map[int, int]) -> Cons:
    """The live entries of ``back`` as a new ascending ``front``."""
    entries = []
    cell = back
    while cell is not None:
        key, item, cell = cell
        if keys.get(item) == key:
            entries.append((key, item))
    return _cons_from(entries)  # back is newest-first, so this is ascending


class LiveQueue:
    """Mutable free queue (same order and operations as ``FreeQueue``, in place).

    ``front`` and ``back`` are ``OrderedDict``s: every push, removal and head
    read is O(1) per item, as vLLM's linked free list is.  ``front`` keeps the
    head-pushed items with the queue's head *last*, so a push at the head is
    one insertion (no ``move_to_end``); ``back`` keeps the tail-pushed items
    in queue order.  Every operation returns ``self`` so rule code reads the
    same on both representations.  Owned by one ``LiveState``.
    """

    __slots__ = ("front", "lo", "hi", "desc", "holes", "back")

    def __init__(self, lo: int = 0, hi: int = 0, *, desc: bool = False) -> None:
        self.front: OrderedDict[int, None] = OrderedDict()  # head-pushed items, head last
        self.lo = lo
        self.hi = max(hi, lo)
        self.desc = desc
        self.holes: dict[int, None] = {}
        self.back: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self.front) + (self.hi - self.lo) - len(self.holes) + len(self.back)

    def __contains__(self, item: object) -> bool:
        if item in self.front or item in self.back:
            return True
        return isinstance(item, int) and self.lo <= item < self.hi and item not in self.holes

    def __iter__(self) -> Iterator[int]:
        yield from reversed(self.front)
        holes = self.holes
        for item in _range(self.lo, self.hi, self.desc):
            if item not in holes:
                yield item
        yield from self.back

    def head(self, count: int) -> list[int]:
        if count <= 0:
            return []
        front = self.front
        if len(front) >= count:
            return list(islice(reversed(front), count))
        out = list(reversed(front))
        lo, hi, holes = self.lo, self.hi, self.holes
        if not holes and not self.desc:  # the usual case: the range is contiguous
            out.extend(range(lo, min(hi, lo + count - len(out))))
        else:
            for item in _range(lo, hi, self.desc):
                if len(out) >= count:
                    break
                if item not in holes:
                    out.append(item)
        if len(out) < count:
            out.extend(islice(self.back, count - len(out)))
        return out

    def missing(self, items: Sequence[int]) -> int | None:
        """The first of ``items`` that is not queued, or ``None`` (one C-level pass over
        ``items`` when they are in the explicit parts or the hole-free range)."""
        # Membership item by item: a set difference against the dicts' key views would
        # walk the views whole, O(pool) per call once many pages were freed.
        rest = set(filterfalse(self.back.__contains__,
                               filterfalse(self.front.__contains__, items)))
        if rest:
            lo, hi, holes = self.lo, self.hi, self.holes
            if min(rest) < lo or max(rest) >= hi or not holes.keys().isdisjoint(rest):
                for item in items:
                    if item not in self:
                        return item
        return None

    def push_tail(self, items: Iterable[int]) -> LiveQueue:
        back = self.back
        for item in items:
            back[item] = None
        return self

    def push_head(self, items: Sequence[int]) -> LiveQueue:
        """Prepend ``items`` (``items[0]`` becomes the head; the caller guarantees none is
        queued, as for ``push_tail``)."""
        front = self.front
        for item in reversed(items):
            front[item] = None
        return self

    def take_head(self, items: Sequence[int]) -> LiveQueue:
        """Remove ``items``, which are the queue's head (``head(len(items))``): ``take``
        without asking where each one sits."""
        front = self.front
        if len(front) < len(items):
            return self.take(items)
        for item in items:
            del front[item]
        return self

    def take(self, items: Iterable[int]) -> LiveQueue:
        front, back, holes = self.front, self.back, self.holes
        lo, hi, desc = self.lo, self.hi, self.desc
        for item in items:
            if item in front:
                del front[item]
            elif item in back:
                del back[item]
            elif not desc and item == lo:
                lo += 1
            elif desc and item == hi - 1:
                hi -= 1
            else:
                holes[item] = None
        if holes:
            lo, hi = _skip_holes(lo, hi, desc, holes)
        self.lo, self.hi = lo, hi
        return self

    def freeze(self) -> FreeQueue:
        """A persistent ``FreeQueue`` with the same items in the same order."""
        queue = FreeQueue.from_range(self.lo, self.hi, desc=self.desc)
        queue = attrs.evolve(queue, holes=Map(self.holes))
        if self.front:
            queue = queue.push_head(list(reversed(self.front)))
        if self.back:
            queue = queue.push_tail(self.back)
        return queue

    def copy(self) -> LiveQueue:
        other = LiveQueue(self.lo, self.hi, desc=self.desc)
        other.front = OrderedDict(self.front)
        other.back = OrderedDict(self.back)
        other.holes = dict(self.holes)
        return other
