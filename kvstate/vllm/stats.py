"""``PrefixCacheStats``: vLLM 0.33's prefix-cache hit counters, counted the same way.

Owned by a ``KVCacheManager`` built with ``log_stats=True``: the scheduler
records each admitted request once (``KVCacheManager.record_prefix_cache_stats``,
right after its first successful ``allocate_slots``), and the metrics loop
takes the counters with ``KVCacheManager.make_prefix_cache_stats``, which
hands the current object over and starts a fresh one.  ``queries`` and
``hits`` count tokens; a request that was preempted before counts in the
``preempted_*`` fields only, so a resumed request does not inflate the rate.
"""

from __future__ import annotations

import attrs


@attrs.define
class PrefixCacheStats:
    """Counters since the last ``make_prefix_cache_stats`` (mutated by ``record``)."""

    reset: bool = False  # reset_prefix_cache succeeded in this interval
    requests: int = 0  # requests admitted with a lookup, never preempted before
    queries: int = 0  # their tokens at admission
    hits: int = 0  # their tokens found in the prefix cache
    preempted_requests: int = 0  # the same three for previously preempted requests
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        """Count one admitted request: ``num_tokens`` looked up, ``num_hits`` of them hit."""
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
            return
        self.requests += 1
        self.queries += num_tokens
        self.hits += num_hits

