"""``BlockPool``: vLLM 0.33's block pool as a front end on the block-mode core.

Block ``b`` is core page ``b``; block 0 is the null block (core page 0, never
held, queued or cached).  ``ref_cnt`` is the number of holder entries of the
page, the free queue is ``state.free_pages`` and the hash map is the prefix
tree, so the pool keeps no bookkeeping of its own beyond per-id block views
and the node-hash listener.  Every mutating call becomes block events applied
to ``self.engine`` (a log ``Recorder`` attaches there); the pool mutates only
through the engine.

Pool-level calls (``get_new_blocks``, ``touch``, ``free_blocks``) hold pages
as ``DETACHED`` (anonymous references); the ``KVCacheManager`` holds them as
its requests.  Deviations from vLLM (rejections instead of corruption) are
listed in docs/vllm.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kvstate.engine import Engine
from kvstate.events import Event, ReqAlloc
from kvstate.events_block import (
    BlockAlloc,
    BlockCache,
    BlockClear,
    BlockHold,
    BlockRelease,
    BlockUncache,
)
from kvstate.state import DETACHED, ROOT, Geometry, RequestId, State
from kvstate.vllm.events_bridge import NodeHashes
from kvstate.vllm.hashing import HashAlgo, block_hash_with_group_id
from kvstate.vllm.kv_events import KVCacheEvent
from kvstate.vllm.request import Request


class KVCacheBlock:
    """A read-only view of block ``block_id``; its fields are read from the pool's state."""

    __slots__ = ("_pool", "block_id")

    def __init__(self, block_id: int, pool: BlockPool) -> None:
        self.block_id = block_id
        self._pool = pool

    @property
    def is_null(self) -> bool:
        return self.block_id == 0

    @property
    def ref_cnt(self) -> int:
        return len(self._pool.engine.state.holders.get(self.block_id, ()))

    @property
    def block_hash(self) -> bytes | None:
        """vLLM's ``BlockHashWithGroupId`` (digest + group id), or None when not cached."""
        state = self._pool.engine.state
        node_id = state.page_node.get(self.block_id)
        if node_id is None:
            return None
        digest = self._pool.hashes.digest_of(node_id, state)
        return None if digest is None else block_hash_with_group_id(digest, 0)

    def __repr__(self) -> str:
        return f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt})"


class BlockPool:
    """vLLM's ``BlockPool`` (one KV-cache group) on a block-mode ``Engine``."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool, hash_block_size: int,
                 enable_kv_cache_events: bool = False, *, hash_seed: str | int | None = None,
                 hash_algo: HashAlgo = "sha256_cbor", max_blocks_per_request: int | None = None,
                 engine: Engine | None = None, keep_events: bool = True) -> None:
        if isinstance(num_gpu_blocks, bool) or not isinstance(num_gpu_blocks, int) \
                or num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be an int >= 2 (block 0 is the null block), "
                             f"got {num_gpu_blocks!r}")
        if isinstance(hash_block_size, bool) or not isinstance(hash_block_size, int) \
                or hash_block_size <= 0:
            raise ValueError(f"hash_block_size must be a positive int, got {hash_block_size!r}")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.enable_kv_cache_events = enable_kv_cache_events
        width_blocks = max_blocks_per_request or num_gpu_blocks
        geometry = Geometry(num_pages=num_gpu_blocks - 1, page_size=hash_block_size,
                            row_width=width_blocks * hash_block_size, mode="block")
        if engine is None:
            engine = Engine(geometry, keep_events=keep_events)
        elif engine.state.seq == 0 and not engine.events and engine.geometry != geometry:
            engine.configure(num_pages=geometry.num_pages, page_size=geometry.page_size,
                             row_width=geometry.row_width, mode="block")
        if engine.geometry.mode != "block" or engine.geometry.num_pages != num_gpu_blocks - 1 \
                or engine.geometry.page_size != hash_block_size:
            raise ValueError(f"engine geometry {engine.geometry} does not fit this pool")
        self.engine = engine
        self.blocks = [KVCacheBlock(block_id, self) for block_id in range(num_gpu_blocks)]
        self.null_block = self.blocks[0]
        self.hashes = NodeHashes(hash_seed=hash_seed, hash_algo=hash_algo,
                                 emit_events=enable_kv_cache_events)
        engine.subscribe(self.hashes)

    # -- reading ----------------------------------------------------------------
    @property
    def state(self) -> State:
        return self.engine.state

    def get_num_free_blocks(self) -> int:
        return len(self.engine.state.free_pages)

    def get_usage(self) -> float:
        return 1.0 - self.get_num_free_blocks() / (self.num_gpu_blocks - 1)

    def free_block_ids(self) -> list[int]:
        """The free queue, head first (vLLM's ``get_all_free_blocks`` as ids)."""
        return list(self.engine.state.free_pages)

    def get_cached_block(self, block_hash: bytes,
                         kv_cache_group_ids: Sequence[int]) -> list[KVCacheBlock] | None:
        """The first cached copy of ``block_hash`` (32-byte digest) per group, or None on a miss."""
        _check_groups(kv_cache_group_ids)
        node_id = self.hashes.node_of.get(bytes(block_hash))
        if node_id is None:
            return None
        node = self.engine.state.nodes.get(node_id)
        if node is None or not node.pages:
            return None
        return [self.blocks[node.pages[0]]]

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the queued vLLM KV events ([] when events are disabled)."""
        if not self.enable_kv_cache_events:
            return []
        return self.hashes.take_events()

    # -- changing (each call applies events to the engine) ------------------------
    def _apply(self, events: Iterable[Event]) -> None:
        apply = self.engine.apply
        for evt in events:
            apply(evt)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop ``num_blocks`` from the free-queue head, lazily evicting cached ones."""
        return self._allocate(DETACHED, num_blocks)

    def _allocate(self, holder: RequestId, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        if num_blocks <= 0:
            return []
        state = self.engine.state
        pages = state.free_pages.head(num_blocks)
        page_node = state.page_node
        if page_node:
            cached = [page for page in pages if page in page_node]
            if cached:
                self.engine.apply(BlockUncache(cached, [page_node[page] for page in cached]))
        self.engine.apply(BlockAlloc.trusted(holder, tuple(pages)))
        blocks = self.blocks
        return [blocks[page] for page in pages]

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Take one more reference on each block (the null block is skipped)."""
        pages = tuple(block.block_id for block in blocks if block.block_id != 0)
        if pages:
            self.engine.apply(BlockHold.trusted(DETACHED, pages))

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference per block; freed blocks queue by vLLM 0.33's rule.

        Uncached blocks go to the head (first given = new head), cached ones
        to the tail; with caching off all go to the head.  A block freed twice
        in one call, or one with no pool-level reference, is rejected
        (``InvalidEvent``) with nothing changed.
        """
        pages = tuple(block.block_id for block in ordered_blocks if block.block_id != 0)
        if pages:
            self.engine.apply(BlockRelease(DETACHED, pages, self.enable_caching))

    def cache_full_blocks(self, request: Request, blocks: Sequence[KVCacheBlock],
                          num_cached_blocks: int, num_full_blocks: int, block_size: int,
                          kv_cache_group_id: int = 0, block_mask: Sequence[bool] | None = None,
                          ) -> None:
        """Cache ``blocks[num_cached_blocks:num_full_blocks]`` under the request's block keys.

        Null blocks and blocks masked out are skipped (their chain position is
        kept); one ``BlockStored`` covers the call.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        _check_groups([kv_cache_group_id])
        if block_size != self.hash_block_size:
            raise ValueError(f"block_size {block_size} differs from hash_block_size "
                             f"{self.hash_block_size} (one group only)")
        if len(request.block_hashes) < num_full_blocks:
            raise ValueError(f"request {request.request_id!r} has {len(request.block_hashes)} "
                             f"hashed blocks, fewer than {num_full_blocks} full blocks to cache")
        if len(blocks) < num_full_blocks:
            raise ValueError(f"{len(blocks)} blocks given for {num_full_blocks} full blocks")
        if block_mask is not None and len(block_mask) != num_full_blocks - num_cached_blocks:
            raise ValueError("block_mask must cover blocks[num_cached_blocks:num_full_blocks]")
        page_ids = [block.block_id for block in blocks[num_cached_blocks:num_full_blocks]]
        if block_mask is not None:
            page_ids = [page if keep else 0 for page, keep in zip(page_ids, block_mask, strict=True)]
        self._cache(request, page_ids, num_cached_blocks, num_full_blocks)

    def _cache(self, request: Request, page_ids: list[int], num_cached: int, num_full: int,
               path: list[int] | None = None) -> None:
        state = self.engine.state
        nodes = state.nodes
        keys = request.block_keys
        # Walk the chain positions [0, num_cached) that already exist.
        current, first = ROOT, 0
        if path is not None and num_cached and len(path) >= num_cached \
                and path[num_cached - 1] in nodes:
            current, first = path[num_cached - 1], num_cached
            del path[num_cached:]
        else:
            while first < num_cached:
                child = nodes[current].children.get(keys[first])
                if child is None:
                    break
                current, first = child, first + 1
            if path is not None:
                del path[first:]
        parent = current
        entries: list[Any] = []
        next_id = state.next_node_id
        walking = True
        node_ids: list[int] = []
        extras = request.block_extra_keys
        for position in range(first, num_full):
            child = nodes[current].children.get(keys[position]) if walking else None
            if child is None:
                walking = False
                child, next_id = next_id, next_id + 1
            page = page_ids[position - num_cached] if position >= num_cached else 0
            entries.append((child, request.block_tokens(position), extras[position], page))
            node_ids.append(child)
            current = child
        if path is not None:
            path.extend(node_ids)
        self.hashes.hints = request.block_hashes[first:num_full]
        self.hashes.lora_id = request.lora_id
        self.engine.apply(BlockCache.trusted(parent, tuple(entries), num_cached - first))

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Uncache the given blocks (holders and queue untouched); uncached ids are ignored."""
        ids = list(block_ids)
        for block_id in ids:
            if isinstance(block_id, bool) or not isinstance(block_id, int) \
                    or not 0 <= block_id < self.num_gpu_blocks:
                raise ValueError(f"Invalid block_id {block_id!r} (pool has {self.num_gpu_blocks})")
        page_node = self.engine.state.page_node
        cached = list(dict.fromkeys(b for b in ids if b in page_node))
        if cached:
            self.engine.apply(BlockUncache(cached, [page_node[b] for b in cached]))

    def reset_prefix_cache(self) -> bool:
        """Drop the whole cache; only when no block but the null block is in use."""
        if self.num_gpu_blocks - self.get_num_free_blocks() != 1:
            return False
        self.engine.apply(BlockClear())
        return True

    # -- for the manager -------------------------------------------------------------
    def open_request(self, request_id: str) -> None:
        if request_id not in self.engine.state.requests:
            self.engine.apply(ReqAlloc((request_id,)))


def _check_groups(group_ids: Sequence[int]) -> None:
    if list(group_ids) != [0]:
        raise ValueError(f"only KV-cache group 0 is supported, got groups {list(group_ids)}")
