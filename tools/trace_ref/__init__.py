"""Independent reference simulator: prefix-cache hit rates straight from trace block hashes.

This package deliberately imports nothing from ``kvstate`` (not even its trace
readers): it parses the files itself and works on block-hash sequences, so its
numbers are an independent check on ``kvstate simulate``.  The command line is
``tools/trace_hit_rates.py``, which also re-exports the names the tests use.

Modules (each owns one concept):

* ``trie``: ``BlockTrace`` (the caller owns it; ``add`` mutates it), the
  ``Outcome`` record and the ``_Tally`` accumulator.
* ``policies``: ``infinite``, ``leaf_lru``, ``fifo``.
* ``candidates``: ``vllm_free_queue``, ``flat_lru``.
* ``reshape``: ``block_costs``, ``split_blocks``, ``output_blocks``,
  ``with_private_outputs`` (derived traces for the Fig. 9 candidates).
* ``fig9``: ``fig9_variants`` and the figure's capacities and values.
* ``readers``: Mooncake, kv-cache-tester and Azure file readers.
* ``stats``: ``percentile``, ``summary``, ``utilization``.
* ``kvsim``: runs kvcache-simulator in a separate interpreter.

Simulators read a trace and never mutate it; each run returns a new ``Outcome``.

Definitions (written into every result):

* A request's blocks are walked root to leaf; blocks are identified by their
  position in a trie of hash ids (``(parent block, hash id)``), so a block is
  the same block only when its whole prefix is the same.
* Hit = the **longest contiguous cached prefix** of the request, looked up
  before the request's own blocks are inserted; every block of the request is
  then inserted.
* Token weighting counts each block by its tokens (Mooncake: the last block is
  partial, ``input_length - 512 * (k - 1)``); block weighting counts blocks.
* Window: requests before ``floor(n * warmup)`` in file order warm the cache
  and are not measured.
* ``lru``: capacity in blocks; only leaves (blocks with no cached child) are
  evicted, least recently used first.  On a hit every matched block is touched
  root to leaf; the matched path is pinned while the request inserts; blocks
  the request inserts are not pinned; insertion stops at the first block that
  cannot be placed (no evictable leaf, or its parent is gone).
* ``fifo``: capacity in blocks, evict the oldest inserted block (any block).
* ``require_full``: a capacity point whose cache never filled during warmup is
  flagged ``underfilled`` (kvcache-simulator omits such points).
* ``vllm_free_queue``: vLLM V1's pool (full blocks only, free queue, lazy
  eviction; see its docstring); ``leaf_lru`` with its keyword knobs and
  ``flat_lru`` are the candidate definitions the ``fig9`` command compares
  with FAST'25 Fig. 9.
"""
