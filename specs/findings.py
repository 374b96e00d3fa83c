"""Findings of the spec: event sequences whose last event the core once accepted.

``FINDINGS``: the last event must now be rejected by the spec model and by
the core.  ``RESULT_FINDINGS``: the last event is legal, and the core once
left a wrong state; now its result refines the spec's.  All are fixed in the
rules (specs/SPEC.md, "Findings").  Kept as data so the regression tests and
the replay corpus (``replay/findings/``) share one source.
"""

from __future__ import annotations

from kvstate import events as ev
from kvstate.state import Geometry

# name -> (geometry, events; the last one must be rejected)
FINDINGS: dict[str, tuple[Geometry, list[ev.Event]]] = {
    "F1-evict-mapped-tree-page": (Geometry(2, 1, 2, 2), [
        ev.ReqAlloc((1,)), ev.Allocate((1,), ((1, (1,)),)),
        ev.Insert(0, (1,), (1,), 1, 1, 1), ev.Evict((1,), False)]),
    "F2-reset-tree-under-mapped-page": (Geometry(2, 1, 2, 2), [
        ev.ReqAlloc((1,)), ev.Allocate((1,), ((1, (1,)),)),
        ev.Insert(0, (1,), (1,), 1, 1, 1), ev.Reset("tree")]),
    "F3-append-into-shared-page": (Geometry(2, 2, 2, 4), [
        ev.ReqAlloc((1,)), ev.ReqAlloc((2,)), ev.Allocate((1,), ((1, (2,)),)),
        ev.Share(2, 0, (2, 3)), ev.Allocate((), ((1, (3,)),))]),
    "F4-unlock-ancestor-without-own-lock": (Geometry(2, 1, 2, 2), [
        ev.Allocate((1,)), ev.Allocate((2,)), ev.Insert(0, (1,), (1,), 1, 1, 0),
        ev.Insert(1, (1,), (2,), 2, 2, 0), ev.Lock(2), ev.Unlock(1)]),
    "F5-share-page-already-in-table": (Geometry(2, 1, 2, 2), [
        ev.ReqAlloc((1,)), ev.Allocate((1,), ((1, (1,)),)),
        ev.Insert(0, (1,), (1,), 1, 1, 1), ev.Share(1, 1, (1,))]),
    "F6-scatter-two-rows-one-page": (Geometry(2, 1, 2, 2), [
        ev.ReqAlloc((1,)), ev.ReqAlloc((2,)), ev.Allocate((1,)),
        ev.Scatter(((1, 0, 1), (2, 0, 1)))]),
    "F9-radix-allocate-of-cached-block": (Geometry(3, 1, 0, 3, "block"), [
        ev.BlockAlloc(0, (1,)), ev.BlockCache(0, ((1, (1,), None, 1),), 0),
        ev.BlockRelease(0, (1,), True, False), ev.Allocate((1,))]),
    # A node inserted without SWA pages is a tombstone; a window lock over it promised
    # SWA KV that does not exist (found by the explorer's ``swa`` scope).
    "F10-swa-lock-over-tombstone": (Geometry(3, 1, 1, 3), [
        ev.Allocate((1,)), ev.Insert(0, (1,), (1,), 1, 1, 0), ev.Lock(1),
        ev.SwaLock(1, 0, 0)]),
}

# The pools a finding's state starts with (``initial_state`` keywords), where it has any.
POOLS: dict[str, dict[str, int]] = {
    "F10-swa-lock-over-tombstone": {"swa_pages": 2},
}

# name -> (geometry, events; the last one is legal and must leave the spec's state)
RESULT_FINDINGS: dict[str, tuple[Geometry, list[ev.Event]]] = {
    "F7-reqfree-drops-cached-block": (Geometry(3, 1, 0, 3, "block"), [
        ev.ReqAlloc(("a",)), ev.BlockAlloc("a", (1,)),
        ev.BlockCache(0, ((1, (1,), None, 1),), 0), ev.ReqFree(("a",))]),
    "F8-block-close-keeps-row": (Geometry(3, 1, 2, 3, "block"), [
        ev.ReqAlloc((1,)), ev.BlockRelease(1, (), True, True)]),
}
