"""SGLang's cache objects with SGLang's names, running on one kvstate engine.

Build them in SGLang's order and they share a single state and event stream::

    pool = ReqToTokenPool(size=8, max_context_len=64)
    allocator = TokenToKVPoolAllocator(size=128)          # joins ``pool``'s engine
    cache = RadixCache(pool, allocator, page_size=1)

Pass ``engine=`` to share an explicit :class:`kvstate.engine.Engine` instead.
Every call reads ``engine.view`` and changes the state only by committing
events (each method's docstring names them); ``.state`` (frozen, for users
and tests) and ``.events`` on each object expose the state and the events so
far.  ``ReqToTokenPool.req_to_token`` is a real int32 tensor kept equal to
the state.  SGLang 0.5.23's parameter and result objects are in
``kvstate.sglang.params`` and re-exported here.
"""

from kvstate.sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from kvstate.sglang.params import (
    CacheInitParams,
    DecLockRefParams,
    DecLockRefResult,
    EvictParams,
    EvictResult,
    IncLockRefResult,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
    MatchResult,
    RadixKey,
    TreeLock,
)
from kvstate.sglang.pool import ReqToTokenPool
from kvstate.sglang.radix_cache import RadixCache, TreeNode
from kvstate.sglang.req import Req

__all__ = [
    "CacheInitParams",
    "DecLockRefParams",
    "DecLockRefResult",
    "EvictParams",
    "EvictResult",
    "IncLockRefResult",
    "InsertParams",
    "InsertResult",
    "MatchPrefixParams",
    "MatchResult",
    "PagedTokenToKVPoolAllocator",
    "RadixCache",
    "RadixKey",
    "Req",
    "ReqToTokenPool",
    "TokenToKVPoolAllocator",
    "TreeLock",
    "TreeNode",
]
