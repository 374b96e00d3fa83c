"""Block-mode canaries: the vLLM explorer catches broken block-pool rules by name.

Each variant breaks one block-event rule of the core (``kvstate.rules.block``,
``kvstate.rules.block_tree``) the way a real block-pool bug would.  Exploring the vLLM front end
(``kvstate.vllm``) in a tiny scope must stop at the named ALWAYS property
that the bug violates.  A rule edits a store in place (``kvstate.rules.store``);
the variants wrap it and undo or add one edit.
"""

from __future__ import annotations

import pytest

from kvstate.checking.explorer import explore
from kvstate.events import BlockAlloc, BlockHold, BlockUncache
from kvstate.invariants import check as core_check
from kvstate.rules import RULES
from kvstate.vllm.explore import VllmLevel, vllm_scope


def touch_leaves_block_queued(rule):
    """``touch`` on a cached free block takes a reference but leaves it in the free queue."""
    def broken(s, event):
        queue = s.free_pages
        saved = queue.copy() if hasattr(queue, "copy") else queue  # a live queue edits in place
        rule(s, event)
        s.free_pages = saved
    return broken


def uncache_keeps_hash_entry(rule):
    """Lazy eviction drops the block from its node but the block still says it is cached."""
    def broken(s, event):
        rule(s, event)
        for page, node in zip(event.pages, event.nodes, strict=True):
            s.page_node[page] = node
    return broken


def alloc_counts_twice(rule):
    """``get_new_blocks`` for a request records the request twice on each block (ref_cnt 2)."""
    def broken(s, event):
        rule(s, event)
        if isinstance(event.holder, str):
            for page in event.pages:
                s.holders[page] = (event.holder, event.holder)
    return broken


CANARIES = [
    ("conservation", BlockHold, touch_leaves_block_queued),
    ("node_shape", BlockUncache, uncache_keeps_hash_entry),
    ("refcounts", BlockAlloc, alloc_counts_twice),
]


@pytest.mark.parametrize("check, event_type, factory", CANARIES,
                         ids=[f"{check}-{t.__name__}" for check, t, _ in CANARIES])
def test_the_vllm_explorer_catches_the_variant(monkeypatch, check, event_type, factory):
    monkeypatch.setitem(RULES, event_type, factory(RULES[event_type]))
    level = VllmLevel(vllm_scope(block_size=1, max_depth=4))
    report = explore(level, probes=())
    assert report.violation is not None, f"{check} was not caught"
    path = report.violation.path
    assert event_type in {type(event) for event in report.violation.events()}
    # The explorer may stop first at a front-end edge check (the vLLM block
    # predictor); the named core invariant must flag the same counterexample.
    final = level.state(path[-1].world)
    assert check in {violation.check for violation in core_check(final)}, report.violation.messages


def test_the_same_scope_is_clean_with_the_real_rules():
    report = explore(VllmLevel(vllm_scope(block_size=1, max_depth=4)), probes=())
    assert report.violation is None and report.unique_states > 500
