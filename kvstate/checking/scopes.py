"""Named exploration scopes: the bounds of a checking run.

A scope fixes the geometry (pages, page size, request rows), the token
vocabulary, the longest key, the depth bound, and which event kinds (event
level) or commands (planner level) are enabled.  Scopes are values; the
registry ``SCOPES`` is the only module state and is never mutated at run time.
"""

from __future__ import annotations

import attrs

EVENT_KINDS = ("rows", "allocate", "append", "assign", "share", "truncate", "free", "copy",
               "insert", "split", "touch", "lock", "evict", "reset")
# Kinds of the newer events, enabled only by the scopes that name them (EVENT_KINDS, the
# default, keeps the pinned radix scopes' exact candidate lists).
EXTRA_KINDS = ("scatter", "free_mapped", "block_alloc", "block_hold", "block_release",
               "block_cache", "block_uncache", "block_clear", "offload", "load", "host_free")
# The hybrid pools' events (kvstate.events.swa / .mamba; kvstate.checking.enabled_hybrid).
SWA_KINDS = ("swa_alloc", "swa_free", "swa_evict", "swa_publish", "swa_touch", "swa_lock",
             "swa_unlock", "swa_adopt", "swa_rebind")
MAMBA_KINDS = ("mamba_alloc", "mamba_bind", "mamba_free", "mamba_donate", "mamba_copy",
               "mamba_commit", "mamba_touch", "mamba_lock", "mamba_unlock", "mamba_evict")
BLOCK_KINDS = ("rows", "block_alloc", "block_hold", "block_release", "block_cache",
               "block_uncache", "block_clear", "reset")
RADIX_PROBES = ("shared_page", "split", "evict_under_partial_locks", "alloc_needed_eviction",
                "cached_page_revived")
COMMANDS = ("admit", "extend", "decode", "checkpoint", "finish", "retract", "evict")


@attrs.frozen
class Scope:
    name: str
    level: str  # "event", "planner" or "vllm"
    num_pages: int
    page_size: int
    num_rows: int
    vocab: int  # tokens are 1..vocab
    max_depth: int
    kinds: tuple[str, ...] = EVENT_KINDS
    max_key_pages: int = 1  # event level: longest inserted key, in pages
    prompt_lengths: tuple[int, ...] = ()  # planner level: prompt lengths admitted
    symmetry: bool = True
    description: str = ""
    mode: str = "radix"  # "block": vLLM's block pool (kvstate.events.block)
    host_pages: int = 0  # > 0: the state has a host tier of that many pages
    probes: tuple[str, ...] = RADIX_PROBES  # the SOMETIMES probes a complete run must hit
    swa_pages: int = 0  # > 0: the state has an SWA pool of that many pages (FULL + SWA)
    mamba_slots: int = 0  # > 0: the state has a Mamba pool of that many slots

    def __attrs_post_init__(self) -> None:
        if self.level not in ("event", "planner", "vllm"):
            raise ValueError(f"level must be 'event', 'planner' or 'vllm', got {self.level!r}")
        if self.symmetry and self.level == "event" and (self.mode != "radix" or self.host_pages):
            # event_view drops the free-list order, which block allocation and the
            # head-only host candidates depend on.
            raise ValueError("symmetry reduction is sound only for radix scopes without a host tier")
        pools = (self.swa_pages, self.mamba_slots)
        if any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in pools):
            raise ValueError(f"swa_pages and mamba_slots must be ints >= 0, got {pools}")
        if any(pools) and (self.level != "event" or self.mode != "radix" or self.host_pages):
            raise ValueError("an SWA or Mamba pool needs an event-level radix scope, no host tier")
        if any(pools) and self.symmetry:
            # event_view forgets the pools (their peers, slots, receipts and free lists).
            raise ValueError("symmetry reduction does not cover the SWA or Mamba pools")
        hybrid = {k for k in self.kinds if k in SWA_KINDS + MAMBA_KINDS}
        if hybrid & set(SWA_KINDS) and not self.swa_pages:
            raise ValueError("SWA kinds need swa_pages > 0")
        if hybrid & set(MAMBA_KINDS) and not self.mamba_slots:
            raise ValueError("Mamba kinds need mamba_slots > 0")
        allowed = EVENT_KINDS + EXTRA_KINDS + SWA_KINDS + MAMBA_KINDS \
            if self.level == "event" else COMMANDS
        unknown = set(self.kinds) - set(allowed)
        if unknown:
            raise ValueError(f"unknown kinds for {self.level} level: {sorted(unknown)}")


SCOPES: dict[str, Scope] = {}


def _add(scope: Scope) -> None:
    SCOPES[scope.name] = scope


_add(Scope("tiny", "event", num_pages=2, page_size=1, num_rows=2, vocab=2, max_depth=6,
           max_key_pages=2,
           description="2 pages, P=1, 2 rows, every event kind; pinned in CI"))
_add(Scope("paged", "event", num_pages=2, page_size=2, num_rows=2, vocab=2, max_depth=6,
           max_key_pages=2,
           description="2 pages of 2 slots, 2 rows, every event kind; pinned in CI"))
_add(Scope("tree", "event", num_pages=3, page_size=1, num_rows=2, vocab=2, max_depth=6,
           kinds=("rows", "allocate", "insert", "split", "touch", "lock", "evict", "free",
                  "assign", "truncate"),
           max_key_pages=2, description="tree-heavy: insert/split/lock/evict over 3 pages"))
_add(Scope("core6", "event", num_pages=3, page_size=1, num_rows=2, vocab=2, max_depth=9,
           kinds=("rows", "allocate", "append", "free", "insert", "split", "evict", "lock",
                  "assign"),
           max_key_pages=2, description="the six core kinds (allocate, append, free, split, "
                                        "insert, evict) plus rows/locks/assign; 37,459 states"))
_add(Scope("core6-1m", "event", num_pages=4, page_size=1, num_rows=2, vocab=2, max_depth=9,
           kinds=("rows", "allocate", "append", "free", "insert", "split", "evict", "lock",
                  "assign"),
           max_key_pages=2,
           description="benchmark: the six core kinds over 4 pages; over a million states "
                       "(benchmarked to 1,000,000; minutes; not in CI)"))
_add(Scope("rows-sglang", "event", num_pages=3, page_size=1, num_rows=2, vocab=2, max_depth=7,
           kinds=("rows", "allocate", "assign", "scatter", "free_mapped", "free", "truncate",
                  "insert", "lock"),
           probes=("dangling_rewritten", "scatter_two_rows", "shared_page"),
           description="SGLang's row writes and frees under a row: Scatter, FreeMapped "
                       "(dangling entries), Assign, Truncate; pinned in CI"))
_add(Scope("rows-sglang-paged", "event", num_pages=2, page_size=2, num_rows=2, vocab=2,
           max_depth=7, kinds=("rows", "allocate", "assign", "scatter", "free_mapped", "free",
                               "truncate", "insert", "lock"),
           probes=("dangling_rewritten", "scatter_two_rows", "shared_page"),
           description="rows-sglang with 2-slot pages (partial pages under Scatter); CI"))
_add(Scope("block", "event", num_pages=3, page_size=1, num_rows=0, vocab=2, max_depth=4,
           kinds=BLOCK_KINDS, mode="block", symmetry=False,
           probes=("block_revived", "hollow_node", "shared_block"),
           description="vLLM block mode: every block event, pool and request holders, "
                       "hollow nodes, null blocks; pinned in CI"))
_add(Scope("block-paged", "event", num_pages=2, page_size=2, num_rows=0, vocab=2, max_depth=4,
           kinds=BLOCK_KINDS, mode="block", symmetry=False,
           probes=("block_revived", "hollow_node", "shared_block"),
           description="the block scope with 2-token blocks; pinned in CI"))
_add(Scope("block-deep", "event", num_pages=3, page_size=1, num_rows=0, vocab=2, max_depth=5,
           kinds=BLOCK_KINDS, mode="block", symmetry=False,
           probes=("block_revived", "hollow_node", "shared_block"),
           description="nightly: the block scope one event deeper (about 48k states)"))
_add(Scope("host", "event", num_pages=3, page_size=1, num_rows=1, vocab=2, max_depth=6,
           kinds=("rows", "allocate", "insert", "split", "lock", "evict", "offload", "load",
                  "host_free", "reset"),
           max_key_pages=2, host_pages=3, symmetry=False,
           probes=("evicted_to_host", "host_only_loaded", "split"),
           description="the host tier: offload, load, host free and how insert, split, "
                       "evict and reset follow it; pinned in CI"))
_add(Scope("planner", "planner", num_pages=3, page_size=1, num_rows=2, vocab=2, max_depth=5,
           kinds=COMMANDS, prompt_lengths=(1, 2), symmetry=False,
           description="SGLang flows through the planner, P=1; pinned in CI"))
_add(Scope("planner-paged", "planner", num_pages=3, page_size=2, num_rows=2, vocab=2,
           max_depth=6, kinds=COMMANDS, prompt_lengths=(1, 2, 3), symmetry=False,
           description="SGLang flows through the planner, P=2 (partial pages); nightly"))
_add(Scope("planner-deep", "planner", num_pages=4, page_size=2, num_rows=2, vocab=2,
           max_depth=7, kinds=COMMANDS, prompt_lengths=(1, 2, 3), symmetry=False,
           description="nightly: deeper planner-level search"))
_add(Scope("vllm-tiny", "vllm", num_pages=3, page_size=1, num_rows=0, vocab=2, max_depth=5,
           kinds=("admit", "decode", "finish", "evict"), prompt_lengths=(1, 2), symmetry=False,
           description="vLLM 0.33 front end (kvstate.vllm), block size 1, 4 blocks; CI"))
_add(Scope("vllm-paged", "vllm", num_pages=3, page_size=2, num_rows=0, vocab=2, max_depth=5,
           kinds=("admit", "decode", "finish", "evict"), prompt_lengths=(1, 2, 3),
           symmetry=False,
           description="vLLM 0.33 front end, block size 2 (partial blocks), 4 blocks"))
_add(Scope("swa", "event", num_pages=3, page_size=1, num_rows=1, vocab=1, max_depth=7,
           kinds=("rows", "allocate", "insert", "lock", "evict", "free") + SWA_KINDS,
           swa_pages=2, symmetry=False,
           probes=("swa:tombstone_recovered", "swa:locked_tombstone_recovered",
                   "swa:internal_tombstone", "swa:cascade_eviction"),
           description="FULL + SWA hybrid: SWA pages, tombstones, window locks and receipts, "
                       "recovery (adopt, rebind), cascade eviction; spec model_swa; CI"))
_add(Scope("mamba", "event", num_pages=2, page_size=1, num_rows=1, vocab=1, max_depth=7,
           kinds=("rows", "allocate", "insert", "lock", "evict") + MAMBA_KINDS,
           mamba_slots=3, symmetry=False,
           probes=("mamba:copy_on_match", "mamba:checkpoint_fork", "mamba:ping_pong_donation",
                   "mamba:cascade_eviction", "mamba:internal_state_evicted",
                   "mamba:existing_state_kept"),
           description="FULL + Mamba hybrid: slots held by rows and nodes, copy-on-match, "
                       "checkpoint forks, ping-pong donation, cascade eviction; spec "
                       "model_mamba; CI"))
