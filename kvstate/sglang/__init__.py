"""SGLang's cache objects with SGLang's names, running on one kvstate engine.

Build them in SGLang's order and they share a single state and event stream::

    pool = ReqToTokenPool(size=8, max_context_len=64)
    allocator = TokenToKVPoolAllocator(size=128)          # joins ``pool``'s engine
    cache = RadixCache(pool, allocator, page_size=1)

Pass ``engine=`` to share an explicit :class:`kvstate.engine.Engine` instead.
Every call becomes events applied by the pure reducer; ``.state`` and
``.events`` on each object expose the current state and the events so far.
"""

from kvstate.sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from kvstate.sglang.pool import ReqToTokenPool
from kvstate.sglang.radix_cache import RadixCache, TreeNode
from kvstate.sglang.req import Req

__all__ = [
    "PagedTokenToKVPoolAllocator",
    "RadixCache",
    "Req",
    "ReqToTokenPool",
    "TokenToKVPoolAllocator",
    "TreeNode",
]
