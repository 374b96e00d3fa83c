"""``KVCacheManager``: vLLM 0.33's KV-cache manager (one group) on the block-mode core.

Covers vLLM's ``KVCacheManager`` with a unitary coordinator over one
full-attention or sliding-window group.  Each request's block table is its
core request table (page 0 = null block), its references are core holders,
and the prefix cache is the core's block-mode prefix tree; every call is
applied to ``self.block_pool.engine`` as block events, in vLLM's order (so
removals precede the store of the same call).  The manager itself keeps only
scheduler-side cursors: ``num_cached_block`` (vLLM's per-running-request
count, which also marks a request as running) and each request's memoised
tree path.  Calls mutate the engine's state and these cursors.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from kvstate.engine import Engine
from kvstate.events_block import BlockHold, BlockRelease
from kvstate.state import ROOT
from kvstate.vllm import sliding_window as swa
from kvstate.vllm.block_pool import BlockPool, KVCacheBlock
from kvstate.vllm.hashing import HashAlgo
from kvstate.vllm.kv_events import BlockStored, KVCacheEvent
from kvstate.vllm.request import Request


@attrs.frozen
class KVCacheBlocks:
    """Blocks per KV-cache group (one group here): ``blocks[group][j]``."""

    blocks: tuple[tuple[KVCacheBlock, ...], ...]

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([block.block_id for block in group] for group in self.blocks)

    def get_unhashed_block_ids(self) -> list[int]:
        return [block.block_id for block in self.blocks[0] if block.block_hash is None]

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(a + b for a, b in zip(self.blocks, other.blocks, strict=True)))


EMPTY_BLOCKS = KVCacheBlocks(((),))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """vLLM's ``KVCacheManager`` for one KV-cache group, deciding exactly as 0.33 does."""

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int,
                 enable_caching: bool = True, sliding_window: int | None = None,
                 enable_kv_cache_events: bool = False, hash_algo: HashAlgo = "sha256_cbor",
                 hash_seed: str | int | None = None, *, keep_events: bool = True,
                 engine: Engine | None = None) -> None:
        if sliding_window is not None and (isinstance(sliding_window, bool)
                                           or not isinstance(sliding_window, int)
                                           or sliding_window < 2):
            raise ValueError(f"sliding_window must be an int >= 2 or None, got {sliding_window!r}")
        if max_model_len <= 0:
            raise ValueError(f"max_model_len must be positive, got {max_model_len}")
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.sliding_window = sliding_window
        self.enable_kv_cache_events = enable_kv_cache_events
        self.hash_algo: HashAlgo = hash_algo
        self.hash_seed = hash_seed
        self.block_pool = BlockPool(num_blocks, enable_caching, block_size, enable_kv_cache_events,
                                    hash_seed=hash_seed, hash_algo=hash_algo,
                                    max_blocks_per_request=_cdiv(max_model_len, block_size) + 1,
                                    keep_events=keep_events, engine=engine)
        self.engine = self.block_pool.engine
        self.num_cached_block: dict[str, int] = {}
        self._paths: dict[str, list[int]] = {}
        self.empty_kv_cache_blocks = EMPTY_BLOCKS
        self.kv_cache_spec_kind = "full_attention" if sliding_window is None else "sliding_window"

    # -- reading ------------------------------------------------------------------
    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def _table(self, request_id: str) -> Sequence[int]:
        record = self.engine.state.requests.get(request_id)
        return () if record is None else record.pages

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        blocks = self.block_pool.blocks
        table = self._table(request_id)
        if not table:
            return EMPTY_BLOCKS
        return KVCacheBlocks((tuple(blocks[page] for page in table),))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return (list(self._table(request_id)),)

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int, int]:
        """``(hit blocks, hit tokens, 0)``: the longest cached prefix, at most ``num_tokens - 1``.

        No side effects (nothing is touched); the third value is vLLM 0.33's
        shared-prefix boundary, always 0 for one group.
        """
        self._check_request(request)
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return EMPTY_BLOCKS, 0, 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        cached = self._cached_copies(request, max_blocks)
        blocks = self.block_pool.blocks
        if self.sliding_window is None:
            hit: list[KVCacheBlock] = []
            for page in cached:
                if page is None:
                    break
                hit.append(blocks[page])
        else:
            found = swa.longest_window_hit(cached, self.sliding_window, self.block_size, 0)
            hit = [blocks[page] for page in found]
        if not hit:
            return EMPTY_BLOCKS, 0, 0
        return KVCacheBlocks((tuple(hit),)), len(hit) * self.block_size, 0

    def _cached_copies(self, request: Request, max_blocks: int) -> list[int | None]:
        """First cached copy of each of the request's first ``max_blocks`` blocks (None: miss)."""
        nodes = self.engine.state.nodes
        keys = request.block_keys
        out: list[int | None] = []
        current = nodes[ROOT]
        for position in range(min(max_blocks, len(keys))):
            child = current.children.get(keys[position])
            if child is None:
                break
            current = nodes[child]
            if current.pages:
                out.append(current.pages[0])
            elif self.sliding_window is None:
                break
            else:
                out.append(None)
        if self.sliding_window is not None:
            out.extend([None] * (max_blocks - len(out)))
        return out

    # -- allocation -------------------------------------------------------------------
    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int,
                                   new_computed_blocks: Sequence[KVCacheBlock],
                                   total_computed_tokens: int) -> int:
        """How many free blocks the next allocation consumes (vLLM's predictor, exact)."""
        required = _cdiv(num_tokens, self.block_size)
        num_req_blocks = len(self._table(request_id))
        if request_id in self.num_cached_block:
            if new_computed_blocks:
                raise ValueError(f"running request {request_id!r} cannot take new prefix hits")
            return max(required - num_req_blocks, 0)
        skipped_blocks = self._skipped_tokens(total_computed_tokens) // self.block_size
        local_blocks = len(new_computed_blocks) + num_req_blocks
        new_blocks = max(required - max(skipped_blocks, local_blocks), 0)
        skip_new = max(0, skipped_blocks - num_req_blocks)
        holders = self.engine.state.holders
        evictable = sum(1 for block in new_computed_blocks[skip_new:]
                        if block.block_id != 0 and block.block_id not in holders)
        return new_blocks + evictable

    def _skipped_tokens(self, num_computed_tokens: int) -> int:
        if self.sliding_window is None:
            return 0
        return swa.num_skipped_tokens(self.sliding_window, num_computed_tokens)

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks: KVCacheBlocks | None = None,
                       num_lookahead_tokens: int = 0) -> KVCacheBlocks | None:
        """Give the request slots for its new tokens; None (and no allocation) when short.

        As vLLM 0.33: out-of-window blocks are freed first (and stay freed on
        failure), then the capacity check, then the hits are touched and
        padded, new blocks are taken from the queue head, and the full blocks
        up to ``min(computed + new, num_tokens)`` are cached.  Returns the
        newly allocated blocks.
        """
        self._check_request(request)
        if num_new_tokens == 0 and num_new_computed_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0 when there are no "
                             "computed tokens to adopt")
        if num_new_tokens < 0 or num_new_computed_tokens < 0 or num_lookahead_tokens < 0:
            raise ValueError("token counts must be non-negative")
        request_id = request.request_id
        hits: tuple[KVCacheBlock, ...] = ()
        if new_computed_blocks is not None:
            hits = new_computed_blocks.blocks[0]
        num_local = request.num_computed_tokens + num_new_computed_tokens
        total_computed = min(num_local, self.max_model_len)
        num_tokens_main = total_computed + num_new_tokens
        need_slots = min(num_tokens_main + num_lookahead_tokens, self.max_model_len)
        if self.sliding_window is not None:
            self.remove_skipped_blocks(request_id,
                                       max(0, total_computed - request.num_in_flight_tokens))
        needed = self.get_num_blocks_to_allocate(request_id, need_slots, hits, num_local)
        if needed > self.block_pool.get_num_free_blocks():
            return None
        if new_computed_blocks is not None and new_computed_blocks is not EMPTY_BLOCKS:
            self._add_computed_blocks(request_id, hits, num_local)
        new_blocks = self._allocate_new_blocks(request_id, need_slots)
        if self.enable_caching:
            self.cache_blocks(request, min(total_computed + num_new_tokens, request.num_tokens))
        return KVCacheBlocks((tuple(new_blocks),)) if new_blocks else EMPTY_BLOCKS

    def _add_computed_blocks(self, request_id: str, hits: Sequence[KVCacheBlock],
                             num_local_computed_tokens: int) -> None:
        if request_id in self.num_cached_block:
            if hits:
                raise ValueError(f"running request {request_id!r} cannot take new prefix hits")
            return
        if self._table(request_id):
            raise ValueError(f"request {request_id!r} already has blocks")
        skipped = self._skipped_tokens(num_local_computed_tokens) // self.block_size
        kept = [block.block_id for block in hits[skipped:]]
        if not self.enable_caching and kept:
            raise ValueError("computed blocks must be empty when prefix caching is disabled")
        pages = (0,) * skipped + tuple(kept)
        if pages:
            self.block_pool.open_request(request_id)
            self.engine.apply(BlockHold(request_id, pages))
        self.num_cached_block[request_id] = len(pages)

    def _allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        count = _cdiv(num_tokens, self.block_size) - len(self._table(request_id))
        if count <= 0:
            return []
        self.block_pool.open_request(request_id)
        return self.block_pool._allocate(request_id, count)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the request's full blocks up to ``num_tokens`` (vLLM's ``cache_blocks``)."""
        request_id = request.request_id
        num_cached = self.num_cached_block.get(request_id, 0)
        num_full = min(num_tokens, len(request.block_hashes) * self.block_size) // self.block_size
        if num_cached >= num_full:
            return
        table = self._table(request_id)
        if len(table) < num_full:
            raise ValueError(f"request {request_id!r} has {len(table)} blocks, fewer than "
                             f"{num_full} full blocks to cache")
        path = self._paths.setdefault(request_id, [])
        self.block_pool._cache(request, list(table[num_cached:num_full]), num_cached, num_full,
                               path)
        self.num_cached_block[request_id] = num_full

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Replace out-of-window blocks with the null block and free them (highest index first)."""
        if self.sliding_window is None:
            return
        table = self._table(request_id)
        indices = swa.skipped_block_indices(table, self.sliding_window, self.block_size,
                                            num_computed_tokens, lambda page: page == 0)
        if indices:
            self.engine.apply(BlockRelease(request_id, tuple(table[i] for i in indices),
                                           self.enable_caching))

    # -- release ------------------------------------------------------------------------
    def free(self, request: Request | str) -> None:
        """Free the request's blocks in reverse order (tail blocks evicted first) and forget it."""
        request_id = request if isinstance(request, str) else request.request_id
        table = self._table(request_id)
        if request_id in self.engine.state.requests:
            pages = tuple(page for page in reversed(table) if page != 0)
            self.engine.apply(BlockRelease(request_id, pages, self.enable_caching, True))
        self.num_cached_block.pop(request_id, None)
        self._paths.pop(request_id, None)

    def evict_blocks(self, block_ids: set[int]) -> None:
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the pool's events, annotating each ``BlockStored`` with the group's spec."""
        events = self.block_pool.take_events()
        out: list[KVCacheEvent] = []
        for event in events:
            if isinstance(event, BlockStored) and event.group_idx == 0:
                event = attrs.evolve(event, kv_cache_spec_kind=self.kv_cache_spec_kind,
                                     kv_cache_spec_sliding_window=self.sliding_window)
            out.append(event)
        return out

    def _check_request(self, request: Request) -> None:
        if request.block_size != self.block_size:
            raise ValueError(f"request block_size {request.block_size} differs from the "
                             f"manager's {self.block_size}")
        if request.hash_seed != self.hash_seed or request.hash_algo != self.hash_algo:
            raise ValueError("request hash_seed/hash_algo differ from the manager's")
