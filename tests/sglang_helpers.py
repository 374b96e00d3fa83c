"""Test helpers: build the SGLang objects and run the scheduler's admission by hand."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from kvstate.sglang import (
    PagedTokenToKVPoolAllocator,
    RadixCache,
    Req,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)


def build(num_tokens=64, page_size=1, rows=8, width=128, disable=False):
    pool = ReqToTokenPool(size=rows, max_context_len=width)
    if page_size == 1:
        allocator = TokenToKVPoolAllocator(size=num_tokens)
    else:
        allocator = PagedTokenToKVPoolAllocator(size=num_tokens, page_size=page_size)
    cache = RadixCache(pool, allocator, page_size=page_size, disable=disable)
    return pool, allocator, cache


def admit(pool, allocator, cache, req, lock=True):
    """Match, lock, take a row and allocate the rest of ``fill_ids`` (SGLang's admission)."""
    req.init_next_round_input()
    fill = req.fill_ids
    slots, node = cache.match_prefix(fill)
    req.prefix_indices, req.last_node = slots, node
    req.cache_protected_len = len(slots)
    if lock:
        cache.inc_lock_ref(node)
    row = pool.alloc(1)[0]
    req.req_pool_idx = row
    if len(slots):
        pool.write((row, slice(0, len(slots))), slots)
    extend = len(fill) - len(slots)
    if allocator.page_size == 1:
        new = allocator.alloc(extend)
    else:
        last = int(slots[-1]) if len(slots) else -1
        new = allocator.alloc_extend([len(slots)], [len(fill)], [last], extend)
    assert new is not None, "test pool too small"
    pool.write((row, slice(len(slots), len(fill))), new)
    return new


def decode_one(pool, allocator, req, token):
    """Forward the last sampled token (give it a slot), then sample ``token``.

    After admission every prompt token has KV; each sampled token gets its
    slot when it is fed back, so a request always has ``len(fill_ids) - 1``
    tokens of KV once it has sampled (the last token has none).
    """
    row = req.req_pool_idx
    position = len(req.origin_input_ids) + len(req.output_ids) - 1
    if allocator.page_size == 1:
        slot = allocator.alloc(1)
    else:
        last = int(pool.req_to_token[row, position - 1])
        slot = allocator.alloc_decode([position + 1], [last])
    assert slot is not None, "test pool too small"
    pool.write((row, slice(position, position + 1)), slot)
    req.output_ids.append(token)
    req.init_next_round_input()
    return int(slot[0])


@contextmanager
def unchanged(pool) -> Iterator[None]:
    """The block leaves the shared state (fingerprint) and ``req_to_token`` exactly as they were."""
    fingerprint = pool.engine.state.fingerprint()
    table = pool.req_to_token.clone()
    yield
    assert pool.engine.state.fingerprint() == fingerprint
    assert torch.equal(pool.req_to_token, table)


__all__ = ["Req", "admit", "build", "decode_one", "torch", "unchanged"]
