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

    def __attrs_post_init__(self) -> None:
        if self.level not in ("event", "planner", "vllm"):
            raise ValueError(f"level must be 'event', 'planner' or 'vllm', got {self.level!r}")
        allowed = EVENT_KINDS if self.level == "event" else COMMANDS
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
                                        "insert, evict) plus rows/locks/assign; >= 1M states"))
_add(Scope("core6-1m", "event", num_pages=4, page_size=1, num_rows=2, vocab=2, max_depth=9,
           kinds=("rows", "allocate", "append", "free", "insert", "split", "evict", "lock",
                  "assign"),
           max_key_pages=2, description="benchmark: the six core kinds over 4 pages; "
                                        ">= 1M unique states (minutes; not in CI)"))
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
