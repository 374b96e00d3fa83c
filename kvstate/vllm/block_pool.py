"""``BlockPool``: vLLM 0.33's block pool as a front end on the block-mode core.

Block ``b`` is core page ``b``; block 0 is the null block (core page 0, never
held, queued or cached).  ``ref_cnt`` is the number of holder entries of the
page, the free queue is the state's ``free_pages`` and the hash map is the
prefix tree, so the pool keeps no bookkeeping of its own beyond per-id block
views and the node-hash listener.  Which blocks a call touches is decided by
``kvstate.planner.block``; the pool checks vLLM's arguments, runs the
planner in one engine batch, and hands back vLLM-shaped results.  The pool
mutates only through its engine (a log ``Recorder`` attaches there).

Pool-level calls (``get_new_blocks``, ``touch``, ``free_blocks``) hold pages
as ``DETACHED`` (anonymous references); the ``KVCacheManager`` holds them as
its requests.  Deviations from vLLM (rejections instead of corruption) are
listed in docs/vllm.md.

A pool built with ``num_kv_cache_groups`` serves a hybrid manager: every
group's chain is its own tree path (``Request.group_chain``), so a block's
hash carries its group and lookups name the groups, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import is_

import msgspec

from kvstate.engine import Engine
from kvstate.planner.block import (
    plan_cache_chain,
    plan_free_blocks,
    plan_get_new_blocks,
    plan_reset,
    plan_touch,
    plan_uncache,
)
from kvstate.state import DETACHED, Geometry
from kvstate.vllm.call_batch import CallBatch
from kvstate.vllm.events_bridge import NodeHashes
from kvstate.vllm.hashing import HashAlgo, block_hash_with_group_id
from kvstate.vllm.kv_events import KVCacheEvent
from kvstate.vllm.request import Request


class KVCacheBlock(msgspec.Struct, gc=False, eq=False, frozen=True):
    """A read-only view of block ``block_id``; its fields are read from the pool's state.

    A view holds the pool's engine and hash listener, not the pool: the pool holds its
    views, so a back reference would make every pool (and its whole engine state) a cycle
    that only the cyclic collector frees.  Without a cycle to find, the collector need not
    track the views either (``gc=False``; a pool makes one per block)."""

    block_id: int
    _engine: Engine
    _hashes: NodeHashes

    @property
    def is_null(self) -> bool:
        return self.block_id == 0

    @property
    def ref_cnt(self) -> int:
        return len(self._engine.view.holders.get(self.block_id, ()))

    @property
    def block_hash(self) -> bytes | None:
        """vLLM's ``BlockHashWithGroupId`` (digest + group id), or None when not cached."""
        view = self._engine.view
        node_id = view.page_node.get(self.block_id)
        if node_id is None:
            return None
        hashes = self._hashes
        digest = hashes.digest_of(node_id, view)
        return None if digest is None else block_hash_with_group_id(digest,
                                                                    hashes.group_of(node_id))

    def __repr__(self) -> str:
        return f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt})"


class BlockPool:
    """vLLM's ``BlockPool`` on a block-mode ``Engine``: one KV-cache group, or with
    ``num_kv_cache_groups`` the groups of a hybrid model (chains keyed by group)."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool, hash_block_size: int,
                 enable_kv_cache_events: bool = False, *, hash_seed: str | int | None = None,
                 hash_algo: HashAlgo = "sha256_cbor", max_blocks_per_request: int | None = None,
                 engine: Engine | None = None, keep_events: bool = True,
                 num_kv_cache_groups: int | None = None) -> None:
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
        self.num_kv_cache_groups = num_kv_cache_groups  # None: one untagged group
        width_blocks = max_blocks_per_request or num_gpu_blocks
        geometry = Geometry(num_pages=num_gpu_blocks - 1, page_size=hash_block_size,
                            row_width=width_blocks * hash_block_size, mode="block")
        if engine is None:
            engine = Engine(geometry, keep_events=keep_events)
        elif engine.seq == 0 and not engine.events and engine.geometry != geometry:
            engine.configure(num_pages=geometry.num_pages, page_size=geometry.page_size,
                             row_width=geometry.row_width, mode="block")
        if engine.geometry.mode != "block" or engine.geometry.num_pages != num_gpu_blocks - 1 \
                or engine.geometry.page_size != hash_block_size:
            raise ValueError(f"engine geometry {engine.geometry} does not fit this pool")
        self.engine = engine
        self.hashes = NodeHashes(hash_seed=hash_seed, hash_algo=hash_algo,
                                 emit_events=enable_kv_cache_events)
        self.blocks = [KVCacheBlock(block_id, engine, self.hashes)
                       for block_id in range(num_gpu_blocks)]
        self.null_block = self.blocks[0]
        engine.subscribe(self.hashes)

    # -- reading ----------------------------------------------------------------
    def get_num_free_blocks(self) -> int:
        """Blocks in the free queue (cached ones included).  Commits nothing."""
        return len(self.engine.view.free_pages)

    def get_usage(self) -> float:
        """``1 - free / (num_gpu_blocks - 1)``.  Commits nothing."""
        return 1.0 - self.get_num_free_blocks() / (self.num_gpu_blocks - 1)

    def free_block_ids(self) -> list[int]:
        """The free queue, head first (vLLM's ``get_all_free_blocks`` as ids).  Commits nothing."""
        return list(self.engine.view.free_pages)

    def get_cached_block(self, block_hash: bytes,
                         kv_cache_group_ids: Sequence[int]) -> list[KVCacheBlock] | None:
        """The first cached copy of ``block_hash`` (32-byte digest) per group, or None on a miss.

        Commits nothing.
        """
        self._check_groups(kv_cache_group_ids)
        nodes = self.engine.view.nodes
        found = []
        for group in kv_cache_group_ids:
            node = nodes.get(self.hashes.node_of.get(block_hash_with_group_id(block_hash, group),
                                                     -1))
            if node is None or not node.pages:
                return None
            found.append(self.blocks[node.pages[0]])
        return found

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the queued vLLM KV events ([] when events are disabled).  Commits nothing."""
        if not self.enable_kv_cache_events:
            return []
        return self.hashes.take_events()

    # -- changing (each call is one engine batch) -----------------------------------
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop ``num_blocks`` from the free-queue head, lazily evicting cached ones.

        Commits ``BlockUncache`` (only for cached head blocks) and ``BlockAlloc``;
        ``ValueError`` with nothing changed when fewer blocks are free or ``num_blocks`` is
        negative.
        """
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int):
            raise TypeError(f"num_blocks must be an int, got {num_blocks!r}")
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        with self.engine.batch() as b:
            pages = plan_get_new_blocks(b, DETACHED, num_blocks)
        blocks = self.blocks
        return [blocks[page] for page in pages]

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Take one more reference on each block (the null block is skipped); commits ``BlockHold``."""
        pages = self.ids_of(blocks)
        with self.engine.batch() as b:
            plan_touch(b, pages)

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference per block; commits ``BlockRelease``.

        Freed blocks queue by vLLM 0.33's rule: uncached ones at the head (first
        given = new head), cached ones at the tail; with caching off all at the
        head.  A block freed twice in one call, or one with no pool-level
        reference, is rejected (``InvalidEvent``) with nothing changed.
        """
        pages = self.ids_of(ordered_blocks)
        with self.engine.batch() as b:
            plan_free_blocks(b, DETACHED, pages, caching=self.enable_caching)

    def cache_full_blocks(self, request: Request, blocks: Sequence[KVCacheBlock],
                          num_cached_blocks: int, num_full_blocks: int, block_size: int,
                          kv_cache_group_id: int = 0, block_mask: Sequence[bool] | None = None,
                          ) -> None:
        """Cache ``blocks[num_cached_blocks:num_full_blocks]`` under the request's block keys.

        Commits one ``BlockCache`` (one ``BlockStored``).  Null blocks and blocks
        masked out are skipped (their chain position is kept).
        """
        if num_cached_blocks >= num_full_blocks:
            return
        self._check_groups([kv_cache_group_id])
        if block_size != self.hash_block_size:
            raise ValueError(f"block_size {block_size} differs from hash_block_size "
                             f"{self.hash_block_size} (one block size only)")
        if num_cached_blocks < 0:
            raise ValueError(f"num_cached_blocks must be >= 0, got {num_cached_blocks}")
        if request.hash_seed != self.hashes.hash_seed or request.hash_algo != self.hashes.hash_algo:
            raise ValueError("request hash_seed/hash_algo differ from the pool's")
        if len(request.block_hashes) < num_full_blocks:
            raise ValueError(f"request {request.request_id!r} has {len(request.block_hashes)} "
                             f"hashed blocks, fewer than {num_full_blocks} full blocks to cache")
        if len(blocks) < num_full_blocks:
            raise ValueError(f"{len(blocks)} blocks given for {num_full_blocks} full blocks")
        if block_mask is not None and len(block_mask) != num_full_blocks - num_cached_blocks:
            raise ValueError("block_mask must cover blocks[num_cached_blocks:num_full_blocks]")
        pages = self.ids_of(blocks[num_cached_blocks:num_full_blocks], keep_null=True)
        if block_mask is not None:
            pages = [page if keep else 0 for page, keep in zip(pages, block_mask, strict=True)]
        chain = request if self.num_kv_cache_groups is None else \
            request.group_chain(kv_cache_group_id)
        with CallBatch(self.engine, self.hashes, request) as b:
            plan_cache_chain(b, chain, pages, num_cached_blocks, num_full_blocks)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Uncache the given blocks (holders and queue untouched); uncached ids are ignored.

        Commits ``BlockUncache`` (one ``BlockRemoved`` per block).
        """
        ids = list(block_ids)
        for block_id in ids:
            if isinstance(block_id, bool) or not isinstance(block_id, int) \
                    or not 0 <= block_id < self.num_gpu_blocks:
                raise ValueError(f"Invalid block_id {block_id!r} (pool has {self.num_gpu_blocks})")
        with self.engine.batch() as b:
            plan_uncache(b, ids)

    def reset_prefix_cache(self) -> bool:
        """Drop the whole cache (commits ``BlockClear``); only when no block but the null block
        is in use, else False and nothing changes."""
        with self.engine.batch() as b:
            return plan_reset(b)

    # -- for the manager -------------------------------------------------------------
    def _check_groups(self, group_ids: Sequence[int]) -> None:
        count = self.num_kv_cache_groups
        if count is None:
            if list(group_ids) != [0]:
                raise ValueError(f"only KV-cache group 0 is supported, got {list(group_ids)}")
        elif not group_ids or any(isinstance(group, bool) or not isinstance(group, int)
                                  or not 0 <= group < count for group in group_ids):
            raise ValueError(f"KV-cache groups must be in 0..{count - 1}, got {list(group_ids)}")

    def ids_of(self, blocks: Iterable[KVCacheBlock], keep_null: bool = False) -> list[int]:
        """Block ids of views of *this* pool (a foreign or fake view is a ``TypeError``).

        Commits nothing.
        """
        if not isinstance(blocks, list | tuple):
            blocks = list(blocks)
        try:  # the usual case: every view is the pool's own (``self.blocks[id] is view``)
            ids = [block.block_id for block in blocks]
            if all(map(is_, map(self.blocks.__getitem__, ids), blocks)):
                return ids if keep_null or 0 not in ids else [i for i in ids if i != 0]
        except (AttributeError, TypeError, IndexError):
            pass
        out = []
        for block in blocks:
            if not isinstance(block, KVCacheBlock) or block._hashes is not self.hashes \
                    or type(block.block_id) is not int \
                    or not 0 <= block.block_id < self.num_gpu_blocks:
                raise TypeError(f"{block!r} is not a block of this pool")
            if keep_null or block.block_id != 0:
                out.append(block.block_id)
        return out
