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

from collections.abc import Iterable, Iterator
from typing import Any

import attrs
import msgpack

from kvstate.engine import Engine
from kvstate.events import BlockAlloc, BlockCache, BlockClear, BlockRelease, BlockUncache
from kvstate.state import DETACHED, ROOT, Geometry, block_child_key
from kvstate.vllm.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    KVEventBatch,
    KVEventDecodeError,
    decode_event_batch,
)


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
    token_mismatches: int = 0  # token_ids not len(block_hashes) * block_size
    peak_copies: int = 0
    block_size: int = 0

    def to_json(self) -> dict[str, int]:
        return attrs.asdict(self)


def _deep_tuple(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_deep_tuple(item) for item in value)
    return value


def read_capture(data: bytes) -> list[KVEventBatch]:
    """Batches from a capture file: concatenated msgpack objects, each a batch or
    ``[seq, payload]`` / ``[topic, seq, payload]`` frames.  Raises ``KVEventDecodeError``."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_ext_len=0)
    unpacker.feed(data)
    batches: list[KVEventBatch] = []
    try:
        for index, item in enumerate(unpacker):
            if isinstance(item, list) and item and isinstance(item[-1], bytes) \
                    and len(item) in (2, 3):
                batches.append(decode_event_batch(item[-1]))
            elif isinstance(item, list):
                batches.append(decode_event_batch(msgpack.packb(item, use_bin_type=True)))
            else:
                raise KVEventDecodeError(f"capture item {index} is a {type(item).__name__}, "
                                         "not a batch or a frame list")
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as exc:
        if isinstance(exc, KVEventDecodeError):
            raise
        raise KVEventDecodeError(f"capture is not a msgpack stream: {exc}") from exc
    return batches


def _events(batches: Iterable[KVEventBatch]) -> Iterator[KVCacheEvent]:
    for batch in batches:
        yield from batch.events


class BlockIndexImporter:
    """Replays KV events into a block-mode engine (``.engine``, ``.stats``)."""

    def __init__(self, batches: list[KVEventBatch], *, medium: str | None = "GPU") -> None:
        self.batches = batches
        self.medium = medium
        self.stats = ImportStats(batches=len(batches))
        block_size, peak = self._survey()
        self.stats.block_size = block_size
        self.stats.peak_copies = peak
        self.engine = Engine(Geometry(num_pages=max(peak, 1), page_size=block_size,
                                      row_width=block_size, mode="block"))
        self._node_of: dict[tuple[int | None, Any], int] = {}

    def _relevant(self, event: KVCacheEvent) -> bool:
        if isinstance(event, AllBlocksCleared):
            return True
        if self.medium is not None and event.medium not in (None, self.medium):
            return False
        return True

    def _survey(self) -> tuple[int, int]:
        """Block size and the most copies alive at once (so the pool never runs short)."""
        copies: dict[tuple[int | None, Any], int] = {}
        live = peak = 0
        block_size = 0
        for event in _events(self.batches):
            if not self._relevant(event):
                continue
            if isinstance(event, BlockStored):
                if block_size and event.block_size != block_size:
                    raise ValueError(f"block size changes from {block_size} to {event.block_size}")
                block_size = event.block_size
                for value in event.block_hashes:
                    key = (event.group_idx, value)
                    copies[key] = copies.get(key, 0) + 1
                live += len(event.block_hashes)
                peak = max(peak, live)
            elif isinstance(event, BlockRemoved):
                for value in event.block_hashes:
                    key = (event.group_idx, value)
                    if copies.get(key, 0) > 0:
                        copies[key] -= 1
                        live -= 1
            else:
                copies.clear()
                live = 0
        if block_size <= 0:
            raise ValueError("the capture has no BlockStored event with a positive block size")
        return block_size, peak

    def run(self) -> Engine:
        """Apply every event (mutates the importer's engine and stats); returns the engine."""
        for event in _events(self.batches):
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
        tokens = list(event.token_ids)
        if len(tokens) != count * size:
            stats.token_mismatches += 1
            tokens = tokens[-count * size:] if len(tokens) > count * size else \
                tokens + [-1] * (count * size - len(tokens))
        extras = list(event.extra_keys) if event.extra_keys is not None else [None] * count
        extras += [None] * (count - len(extras))
        group = event.group_idx
        state = self.engine.state
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
        state = self.engine.state
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
            current = child
        stats.stored_blocks += count
        self.engine.apply(BlockCache(parent, entries, 0))

    @staticmethod
    def _extra(published: Any, group: int | None, orphan_mark: Any) -> Any:
        parts: list[Any] = []
        if group not in (None, 0):
            parts.append(("group", group))
        if orphan_mark is not None:
            parts.append(orphan_mark)
        if published is not None:
            parts.append(("keys", _deep_tuple(published)))
        return tuple(parts) if parts else None

    def _remove(self, event: BlockRemoved) -> None:
        for value in event.block_hashes:
            self.stats.removed_blocks += 1
            node_id = self._node_of.get((event.group_idx, value))
            node = self.engine.state.nodes.get(node_id) if node_id is not None else None
            if node is None or not node.pages:
                self.stats.unknown_removals += 1
                continue
            if len(node.pages) > 1:
                self.stats.removed_with_copies_left += 1
            page = node.pages[0]
            self.engine.apply(BlockUncache([page], [node_id]))
            self.engine.apply(BlockRelease(DETACHED, [page]))

    def _clear(self) -> None:
        self.stats.clears += 1
        self.engine.apply(BlockClear())
        held = sorted(self.engine.state.holders.keys())
        if held:
            self.engine.apply(BlockRelease(DETACHED, held))
        self._node_of.clear()
