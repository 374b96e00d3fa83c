"""Turn a captured vLLM or SGLang KV-event stream into block-mode core events.

Owned by the vLLM front end; used by ``kvstate import-events``.  The result
is a kvstate log of the *prefix index* those events describe (what a router
such as Dynamo or llm-d rebuilds), which ``kvstate replay`` then checks:

* ``BlockStored``      -> ``BlockAlloc`` of one page per block (held by the
  index, ``DETACHED``) + ``BlockCache`` of the chain under its parent;
* ``BlockRemoved``     -> per hash, ``BlockUncache`` + ``BlockRelease`` of one copy;
* ``AllBlocksCleared`` -> ``BlockClear`` + ``BlockRelease`` of every page.

Pages stand for physical copies: a hash stored twice is two copies of one
tree node, and a removal takes away one copy, so a hash stays indexed until
its last copy goes (vLLM issue #55092: duplicates are counted, not dropped).
Tree identity is tokens plus extra keys (and the KV-cache group); a chain
whose parent hash was never seen starts under the root with that parent hash
as an extra key.  Nothing here mutates its inputs; ``BlockIndexImporter``
owns its engine and counters.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import attrs

from kvstate.engine import Engine
from kvstate.events import BlockAlloc, BlockCache, BlockClear, BlockRelease, BlockUncache
from kvstate.events.base import MAX_ID, MAX_NAME_CHARS
from kvstate.state import DETACHED, ROOT, Geometry, block_child_key
from kvstate.vllm.capture import CaptureError, read_capture
from kvstate.vllm.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    KVEventBatch,
)

__all__ = ["MAX_BLOCK_SIZE", "BlockIndexImporter", "CaptureError", "ImportStats", "read_capture"]

MAX_BLOCK_SIZE = 1 << 16
"""Largest ``block_size`` an imported ``BlockStored`` may declare (vLLM and SGLang
use at most a few thousand tokens per block); a larger one is malformed input."""


@attrs.define
class ImportStats:
    """Counts of what an import saw (mutable; owned by the importer)."""

    batches: int = 0
    stored_events: int = 0
    stored_blocks: int = 0
    duplicate_copies: int = 0  # a block stored while its hash already had a copy
    removed_blocks: int = 0
    removed_with_copies_left: int = 0  # the over-invalidation case of vLLM #55092
    unknown_removals: int = 0  # a removal of a hash with no copy indexed
    clears: int = 0
    orphan_chains: int = 0  # a store whose parent hash was never seen
    skipped_other_medium: int = 0
    token_mismatches: int = 0  # more token_ids than len(block_hashes) * block_size (extra ignored)
    peak_copies: int = 0
    block_size: int = 0

    def to_json(self) -> dict[str, int]:
        return attrs.asdict(self)


def _deep_tuple(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_deep_tuple(item) for item in value)
    return value


def _published_key(published: Any) -> tuple[Any, ...]:
    """One block's published extra keys as a flat tagged key the core accepts.

    Flat keys of ints and short strings stay readable (``("keys", *values)``);
    anything else (nested arrays, floats, bytes, long strings) is named by the
    SHA-256 of its repr under another tag, so distinct keys never meet.
    """
    values = _deep_tuple(published)
    if all((type(v) is int and -MAX_ID - 1 <= v <= MAX_ID)
           or (type(v) is str and len(v) <= MAX_NAME_CHARS) for v in values):
        return ("keys", *values)
    return ("keys-sha256", hashlib.sha256(repr(values).encode()).hexdigest())


BatchSource = Sequence[KVEventBatch] | Callable[[], Iterable[KVEventBatch]]


class BlockIndexImporter:
    """Replays KV events into a block-mode engine (``.engine``, ``.stats``).

    ``batches`` is a sequence, or a callable returning a fresh iterable (such
    as a :class:`~kvstate.vllm.capture.CaptureReader`) each time: the importer
    reads it twice, once to size the pool and validate, once to apply, and
    keeps neither the batches nor the applied events, so a capture imports in
    memory proportional to the index it describes.  Invalid input raises
    :class:`CaptureError` (with the byte offset when the iterable has an
    ``offset``).  ``salvage=True`` instead imports the batches before the first
    bad one and sets :attr:`stopped` to the error.
    """

    def __init__(self, batches: BatchSource, *, medium: str | None = "GPU",
                 salvage: bool = False) -> None:
        self._source: Callable[[], Iterable[KVEventBatch]] = (
            batches if callable(batches) else lambda: batches)
        self.medium = medium
        self.salvage = salvage
        self.stopped: CaptureError | None = None
        self._limit: int | None = None  # batches to apply (salvage: those before the bad one)
        self.stats = ImportStats()
        block_size, peak = self._survey()
        self.stats.block_size = block_size
        self.stats.peak_copies = peak
        self.engine = Engine(Geometry(num_pages=max(peak, 1), page_size=block_size,
                                      row_width=block_size, mode="block"), keep_events=False)
        # The latest node of each (group, hash), to find a store's parent.
        self._node_of: dict[tuple[int | None, Any], int] = {}
        self._sweep_at = 1024
        # The node of every live copy of each (group, hash), newest last.  A removal
        # takes one of these, so the copies alive are exactly those the survey counted
        # (and the pool it sized suffices) even when one hash names two token chains.
        self._copies: dict[tuple[int | None, Any], list[int]] = {}

    def _relevant(self, event: KVCacheEvent) -> bool:
        if isinstance(event, AllBlocksCleared):
            return True
        if self.medium is not None and event.medium not in (None, self.medium):
            return False
        return True

    def _survey(self) -> tuple[int, int]:
        """Validate every batch; the block size and the most copies alive at once
        (so the pool never runs short)."""
        copies: dict[tuple[int | None, Any], int] = {}
        live = peak = block_size = 0
        batches = iter(self._source())
        index = 0
        while True:
            try:
                batch = next(batches, None)
                if batch is None:
                    break
                block_size = self._check(batch, block_size, getattr(batches, "offset", None), index)
            except CaptureError as error:
                if not self.salvage:
                    raise
                self.stopped, self._limit = error, index
                break
            index += 1
            for event in batch.events:
                if not self._relevant(event):
                    continue
                if isinstance(event, BlockStored):
                    for value in event.block_hashes:
                        key = (event.group_idx, value)
                        copies[key] = copies.get(key, 0) + 1
                    live += len(event.block_hashes)
                    peak = max(peak, live)
                elif isinstance(event, BlockRemoved):
                    for value in event.block_hashes:
                        key = (event.group_idx, value)
                        left = copies.get(key, 0)
                        if left > 0:
                            live -= 1
                            if left == 1:
                                del copies[key]  # keep the survey's memory to the live copies
                            else:
                                copies[key] = left - 1
                else:
                    copies.clear()
                    live = 0
        self.stats.batches = index
        if block_size <= 0:
            raise CaptureError(None, "the capture has no BlockStored event with a positive block size")
        return block_size, peak

    def _check(self, batch: KVEventBatch, block_size: int, offset: int | None, index: int) -> int:
        """The block size after ``batch``; raises ``CaptureError`` for a declared
        size out of bounds or a store with fewer token ids than its blocks hold."""
        for event in batch.events:
            if not isinstance(event, BlockStored):
                continue
            size = event.block_size
            problem = None
            if not 1 <= size <= MAX_BLOCK_SIZE:
                problem = f"block_size {size} outside 1..{MAX_BLOCK_SIZE}"
            elif len(event.token_ids) < len(event.block_hashes) * size:
                problem = (f"a BlockStored of {len(event.block_hashes)} blocks of {size} tokens "
                           f"carries only {len(event.token_ids)} token ids")
            elif self._relevant(event) and block_size and size != block_size:
                problem = f"block size changes from {block_size} to {size}"
            if problem is not None:
                raise CaptureError(offset, problem, index)
            if self._relevant(event):
                block_size = size
        return block_size

    def _batches(self) -> Iterator[KVEventBatch]:
        return itertools.islice(self._source(), self._limit)

    def run(self) -> Engine:
        """Apply every event (mutates the importer's engine and stats); returns the engine."""
        for event in (event for batch in self._batches() for event in batch.events):
            if not self._relevant(event):
                self.stats.skipped_other_medium += 1
            elif isinstance(event, BlockStored):
                self._store(event)
            elif isinstance(event, BlockRemoved):
                self._remove(event)
            else:
                self._clear()
        return self.engine

    def _store(self, event: BlockStored) -> None:
        stats = self.stats
        stats.stored_events += 1
        size = stats.block_size
        count = len(event.block_hashes)
        if count == 0:
            return
        tokens = event.token_ids
        if len(tokens) != count * size:
            # More token ids than the blocks hold (vLLM counts the tokens of skipped null
            # blocks); fewer were refused by the survey, so keys never need padding and
            # the index holds no more tokens than the capture carries.
            stats.token_mismatches += 1
            tokens = tokens[-count * size:]
        extras = list(event.extra_keys) if event.extra_keys is not None else [None] * count
        extras += [None] * (count - len(extras))
        group = event.group_idx
        state = self.engine.view
        parent = ROOT
        orphan_mark: Any = None
        if event.parent_block_hash is not None:
            known = self._node_of.get((group, event.parent_block_hash))
            if known is not None and known in state.nodes:
                parent = known
            else:
                stats.orphan_chains += 1
                orphan_mark = ("parent", event.parent_block_hash)
        pages = tuple(state.free_pages.head(count))
        self.engine.apply(BlockAlloc(DETACHED, pages))
        state = self.engine.view
        entries = []
        current = parent
        next_id = state.next_node_id
        walking = True
        for index, value in enumerate(event.block_hashes):
            key = tuple(tokens[index * size:(index + 1) * size])
            extra = self._extra(extras[index], group, orphan_mark if index == 0 else None)
            child = state.nodes[current].children.get(block_child_key(key, extra)) \
                if walking else None
            if child is None:
                walking = False
                child, next_id = next_id, next_id + 1
            elif state.nodes[child].pages:
                stats.duplicate_copies += 1
            entries.append((child, key, extra, pages[index]))
            self._node_of[(group, value)] = child
            self._copies.setdefault((group, value), []).append(child)
            current = child
        stats.stored_blocks += count
        self.engine.apply(BlockCache(parent, tuple(entries), 0))
        if len(self._node_of) > self._sweep_at:
            self._forget_gone_nodes()

    def _forget_gone_nodes(self) -> None:
        """Drop hash entries whose node left the tree (node ids are never reused, so
        such an entry can never match again); keeps the map to the index's size."""
        nodes = self.engine.view.nodes
        self._node_of = {key: node for key, node in self._node_of.items() if node in nodes}
        self._sweep_at = 2 * len(self._node_of) + 1024  # amortised: the next sweep waits as long

    @staticmethod
    def _extra(published: Any, group: int | None, orphan_mark: Any) -> Any:
        parts: list[Any] = []
        if group not in (None, 0):
            parts.append(("group", group))
        if orphan_mark is not None:
            parts.append(orphan_mark)
        if published is not None:
            parts.append(_published_key(published))
        return tuple(parts) if parts else None

    def _remove(self, event: BlockRemoved) -> None:
        for value in event.block_hashes:
            self.stats.removed_blocks += 1
            key = (event.group_idx, value)
            copies = self._copies.get(key)
            if not copies:
                self.stats.unknown_removals += 1
                continue
            node_id = copies.pop()
            if not copies:
                del self._copies[key]
            node = self.engine.view.nodes[node_id]  # it holds this copy's page
            if len(node.pages) > 1:
                self.stats.removed_with_copies_left += 1
            page = node.pages[0]
            self.engine.apply(BlockUncache((page,), (node_id,)))
            self.engine.apply(BlockRelease(DETACHED, (page,)))

    def _clear(self) -> None:
        self.stats.clears += 1
        self.engine.apply(BlockClear())
        held = tuple(sorted(self.engine.view.holders.keys()))
        if held:
            self.engine.apply(BlockRelease(DETACHED, held))
        self._node_of.clear()
        self._copies.clear()
