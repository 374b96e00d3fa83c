"""The incremental checker and the full checks report the same first violation.

``kvstate.invariants.incremental.IncrementalChecker`` checks only where the
rules said a run of events changed a live state; the full checks
(``kvstate.invariants.check``) recompute everything.  Each case corrupts a
clean live state in one named way, reports what it changed the way a buggy
rule would (``live.touched``), and both must find exactly that named
invariant first.  Every named invariant has a corruption, in radix mode
with a host tier and in block mode.  Clean seeded walks must stay clean on
both (tests/test_backends.py compares the backends on the same walks).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from kvstate import apply_all
from kvstate import events as ev
from kvstate.backends.live import LiveState
from kvstate.checking.enabled import candidate_events
from kvstate.checking.levels import geometry_of
from kvstate.checking.scopes import SCOPES
from kvstate.errors import InvalidEvent
from kvstate.invariants import CHECKS, check
from kvstate.invariants.incremental import IncrementalChecker
from kvstate.records import HostNode
from kvstate.state import Geometry, initial_state


def radix_base() -> LiveState:
    """Rows 1, 2 open; node 1 [5, 6] on pages 1-2 (locked, mapped by row 1), node 2 [7]
    under it evicted to host only; row 2 holds page 3; page 4 is DETACHED."""
    state = apply_all(initial_state(Geometry(6, 1, 3, 6), host_pages=4), [
        ev.ReqAlloc((1, 2)), ev.Allocate((1, 2), ((1, (1, 2)),)),
        ev.Insert(0, (5, 6), (1, 2), 1, 1, 1), ev.Lock(1),
        ev.Allocate((3,), ((2, (3,)),)), ev.Allocate((4,)),
        ev.Allocate((5,)), ev.Insert(1, (7,), (5,), 2, 2, 0),
        ev.Offload(1, (0, 1)), ev.Offload(2, (2,)), ev.Evict((2,), False)])
    return LiveState.thaw(state)


def block_base() -> LiveState:
    """Request "a" holds pages 1-2, page 1 cached as node 1; the pool holds page 3."""
    state = apply_all(initial_state(Geometry(4, 1, 0, 4, mode="block")), [
        ev.ReqAlloc(("a",)), ev.BlockAlloc("a", (1, 2)),
        ev.BlockCache(0, ((1, (5,), None, 1),), 0), ev.BlockAlloc(0, (3,))])
    return LiveState.thaw(state)


def _unback(live: LiveState) -> None:
    """Drop node 1's host copy consistently (host pages free again): its host-only child
    keeps a copy under a parent without one."""
    host = live.host
    assert host is not None
    pages = host.backup.pop(1)
    for page in pages:
        del host.owner[page]
    host.free_pages.push_tail(list(pages))
    live.touched.host_nodes.add(1)


def _set(obj: object, name: str, value: object) -> None:
    setattr(obj, name, value)


def _unprotect(live: LiveState, node_id: int) -> None:
    """Move a node's tokens from the protected to the evictable size (the sizes agree with
    a lock count taken to zero or below)."""
    tokens = len(live.nodes[node_id].key)
    live.evictable_size += tokens
    live.protected_size -= tokens


# name: (expected check, base, corruption of the live state that reports what it touched)
CORRUPTIONS: dict[str, tuple[str, Callable[[], LiveState], Callable[[LiveState], None]]] = {
    "detached-page-also-free": ("conservation", radix_base, lambda s: (
        s.free_pages.push_tail([4]), s.touched.pages.add(4))),
    "holder-not-in-its-table": ("refcounts", radix_base, lambda s: (
        s.holders.__setitem__(3, (2, 1)), s.touched.pages.add(3))),
    "open-row-also-free": ("reserved_ids", radix_base, lambda s: (
        s.free_rows.push_head([1]), s.touched.table(1, 0))),
    "evictable-size-off": ("tree_sizes", radix_base, lambda s: (
        _set(s, "evictable_size", s.evictable_size + 1),)),
    "locked-node-in-leaf-index": ("leaf_index", radix_base, lambda s: (
        s.leaves.__setitem__(1, None), s.touched.nodes.add(1))),
    "below-index-off": ("lock_monotonic", radix_base, lambda s: (
        _set(s.nodes[1], "below", 1), s.touched.nodes.add(1))),
    "locked-path-below-index-off": ("lock_monotonic", radix_base, lambda s: (
        _set(s.nodes[1], "below", 1), s.touched.locked.add(1))),
    "locked-path-negative-lock": ("lock_monotonic", radix_base, lambda s: (
        _set(s.nodes[1], "lock_ref", -1), _unprotect(s, 1), s.touched.locked.add(1))),
    "unlocked-leaf-missing-from-index": ("leaf_index", radix_base, lambda s: (
        _set(s.nodes[1], "lock_ref", 0), _unprotect(s, 1), s.touched.locked.add(1))),
    "child-index-lost": ("node_shape", radix_base, lambda s: (
        s.nodes[0].children.pop(5), s.touched.nodes.add(0))),
    "page-claims-a-node-that-does-not-list-it": ("node_shape", radix_base, lambda s: (
        s.page_node.__setitem__(4, 1), s.touched.pages.add(4))),
    "single-holder-does-not-map-its-page": ("refcounts", radix_base, lambda s: (
        s.holders.__setitem__(3, (1,)), s.touched.pages.add(3))),
    "detached-page-mapped-by-a-request": ("table_refs_live", radix_base, lambda s: (
        s.holders.__setitem__(3, (0,)), s.touched.pages.add(3))),
    "child-index-points-elsewhere": ("node_shape", radix_base, lambda s: (
        s.nodes[0].children.__setitem__(5, 99), s.touched.nodes.add(0))),
    "a-held-page-mapped-by-a-second-request": ("table_refs_live", radix_base, lambda s: (
        s.requests[1].pages.__setitem__(1, 3), s.tree_refs.pop(2), s.touched.table(1, 1))),
    "node-with-an-empty-key": ("node_shape", radix_base, lambda s: (
        _set(s.nodes[1], "key", ()), _set(s, "protected_size", s.protected_size - 2),
        s.touched.nodes.add(1))),
    "committed-past-allocated": ("request_lengths", radix_base, lambda s: (
        _set(s.requests[2], "committed", 5), s.touched.table(2, 0))),
    "tree-refs-index-off": ("table_refs_live", radix_base, lambda s: (
        s.tree_refs.__setitem__(1, 2), s.touched.pages.add(1))),
    "access-after-clock": ("clock", radix_base, lambda s: (
        _set(s.nodes[1], "last_access", 99), s.touched.stamped.add(1))),
    "host-page-owned-and-free": ("host_owned_once", radix_base, lambda s: (
        s.host.free_pages.push_tail([0]),
        s.touched.host_nodes.add(1))),
    "host-copy-not-root-closed": ("host_root_closed", radix_base, _unback),
    "host-only-node-lost-key": ("host_only_keeps_key", radix_base, lambda s: (
        s.host.evicted.__setitem__(2, HostNode(1, (), 2)), s.touched.host_nodes.add(2))),
    "block-pool-page-also-free": ("conservation", block_base, lambda s: (
        s.free_pages.push_tail([3]), s.touched.pages.add(3))),
    "block-request-held-twice": ("refcounts", block_base, lambda s: (
        s.holders.__setitem__(1, ("a", "a")), s.touched.pages.add(1))),
    "block-mapped-not-held": ("table_refs_live", block_base, lambda s: (
        s.holders.__setitem__(2, (0,)), s.touched.pages.add(2))),
    "block-page-held-by-another-request": ("refcounts", block_base, lambda s: (
        s.holders.__setitem__(2, ("b",)), s.touched.pages.add(2))),
    "block-node-without-copy": ("node_shape", block_base, lambda s: (
        _set(s.nodes[1], "pages", ()), s.touched.nodes.add(1))),
}


def test_every_named_invariant_has_a_corruption():
    assert {target for target, _, _ in CORRUPTIONS.values()} == set(CHECKS)


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_incremental_and_full_checks_find_the_same_first_violation(name):
    target, base, corrupt = CORRUPTIONS[name]
    live = base()
    checker = IncrementalChecker(live)
    assert check(live) == [] and checker.check() == []
    corrupt(live)
    full = check(live)
    incremental = checker.check()
    assert full and incremental, (full, incremental)
    assert full[0].check == incremental[0].check == target, (full, incremental)


def _page_edits(block: bool) -> list[tuple[str, Callable[[LiveState, int], None]]]:
    """One-entry edits of a page: its holders, its tree node, its tree-reference count, the
    free list.  ``(name, edit(live, page))``."""
    one, two = ("a", "b") if block else (1, 2)

    def hold(*held: object) -> Callable[[LiveState, int], None]:
        return lambda live, page: live.holders.__setitem__(page, held)

    def node(node_id: int) -> Callable[[LiveState, int], None]:
        return lambda live, page: live.page_node.__setitem__(page, node_id)

    def refs(count: int) -> Callable[[LiveState, int], None]:
        return lambda live, page: live.tree_refs.__setitem__(page, count)

    return [
        ("unheld", lambda live, page: live.holders.pop(page, None)),
        ("pool-held", hold(0)), ("held-by-one", hold(one)), ("held-by-two", hold(two)),
        ("held-by-both", hold(one, two)), ("held-twice", hold(one, one)),
        ("pool-and-request", hold(0, one)),
        ("in-node-1", node(1)), ("in-a-missing-node", node(99)),
        ("out-of-the-tree", lambda live, page: live.page_node.pop(page, None)),
        ("no-tree-refs", lambda live, page: live.tree_refs.pop(page, None)),
        ("one-tree-ref", refs(1)), ("two-tree-refs", refs(2)),
        ("also-free", lambda live, page: None if page in live.free_pages
         else live.free_pages.push_tail([page])),
        ("freed-while-mapped", _free_page),
    ]


def _free_page(live: LiveState, page: int) -> None:
    """A page released whole (no holder, out of the tree, on the free list), tables kept."""
    live.holders.pop(page, None)
    live.page_node.pop(page, None)
    live.tree_refs.pop(page, None)
    if page not in live.free_pages:
        live.free_pages.push_tail([page])


def _walked(scope: str, seed: int) -> Callable[[], LiveState]:
    """A base state from 80 random events of ``scope`` (shared pages, tree pages mapped
    by several requests, cached blocks held by several requests)."""
    chosen = SCOPES[scope]
    rng = random.Random(seed)
    state = initial_state(geometry_of(chosen))
    for _ in range(80):
        event = rng.choice(list(candidate_events(state, chosen)))
        try:
            state = apply_all(state, [event])
        except InvalidEvent:
            continue
    return lambda: LiveState.thaw(state)


@pytest.mark.parametrize("base", [radix_base, block_base, _walked("rows-sglang-paged", 3),
                                  _walked("core6", 5), _walked("block-paged", 11)],
                         ids=["radix", "block", "walked-rows", "walked-core6", "walked-block"])
def test_every_page_edit_is_found_with_every_page_reported(base):
    """The quick page test (``suspect_pages``) may pass a page on to the full page check,
    never wave a broken one through: for every page and every one-entry edit of it, with
    every page reported changed (so a check that stops early is caught too) and, as the
    tree rules do, the nodes a page moved between, the incremental checker finds a
    violation exactly when the full checks do."""
    geometry = base().geometry
    edits = _page_edits(geometry.mode == "block")
    broken = 0
    for page in range(1, geometry.num_pages + 1):
        for name, edit in edits:
            live = base()
            checker = IncrementalChecker(live)
            assert checker.check() == []
            was = live.page_node.get(page)
            edit(live, page)
            live.touched.pages.update(range(1, geometry.num_pages + 1))
            live.touched.nodes.update(node for node in (was, live.page_node.get(page))
                                      if node is not None)
            full, incremental = check(live), checker.check()
            assert bool(full) == bool(incremental), (page, name, full, incremental)
            broken += bool(full)
    assert broken > len(edits)  # most edits break something on most pages


@pytest.mark.parametrize("every", [1, 4])
@pytest.mark.parametrize("scope", ["paged", "core6", "rows-sglang-paged", "block-paged", "host",
                                   "swa", "mamba"])
def test_clean_walks_stay_clean_on_both_checkers(scope, every):
    """Checked after every event, or after runs of four (the changes of a run accumulate)."""
    chosen = SCOPES[scope]
    live = LiveState.thaw(initial_state(geometry_of(chosen), host_pages=chosen.host_pages,
                                        swa_pages=chosen.swa_pages,
                                        mamba_slots=chosen.mamba_slots))
    checker = IncrementalChecker(live)
    rng = random.Random(7)
    applied = 0
    for _ in range(300):
        frozen = live.freeze()
        event = rng.choice(list(candidate_events(frozen, chosen)))
        try:
            live.apply(event)
        except InvalidEvent:
            continue
        applied += 1
        if applied % every == 0:
            assert checker.check() == [] and check(live) == [], event


def test_a_run_of_edits_to_one_table_is_rechecked_from_its_first_edit():
    """A rewrite at index 0, then an append at index 2, in one run: the checker must
    re-read row 1's table from index 0 (``Touched.table`` keeps the lowest index)."""
    live = radix_base()
    checker = IncrementalChecker(live)
    live.apply(ev.Assign(1, 0, (4,)))  # DETACHED page 4 replaces tree page 1 at index 0
    live.apply(ev.Allocate((6,), ((1, (6,)),)))
    assert live.touched.requests[1] == 0
    assert checker.check() == [] and check(live) == []


def test_host_events_are_checked_where_they_touch():
    """Load, evict to host, host free and offload on a checked live state: both checkers
    stay clean after each (the rules report what they touched, host nodes included)."""
    live = radix_base()  # node 2 is host-only under node 1; pages 5 and 6 are free
    checker = IncrementalChecker(live)
    for event in (ev.Load(2, (5,), 10), ev.Evict((2,), True), ev.Load(2, (6,), 11),
                  ev.Evict((2,), False), ev.HostFree((2,), True), ev.Allocate((5,)),
                  ev.Insert(1, (8,), (5,), 3, 12, 0), ev.Offload(3, (2,))):
        live.apply(event)
        assert checker.check() == [] and check(live) == [], event
    assert live.host.backup[3] == (2,) and 2 not in live.host.evicted
