"""``TransientApplier``: the pure reducer's results, computed in place.

Ownership: the applier owns its ``TransientState``; ``state()`` hands out a
frozen copy (cached until the next event), so callers never see the mutable
containers.  ``apply`` mutates the applier and returns nothing.

Exactness: for every event, the transient rule either leaves the state
untouched and declines, or does what the pure reducer does.  A declined
event (an invalid one, or a kind with no transient rule such as ``Reset`` or
the block-pool events) goes through ``kvstate.reducer.apply`` on a frozen
copy, so the error an invalid event raises is the reducer's own
``InvalidEvent``, word for word, and the state stays unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvstate import events as ev
from kvstate import events_block as evb
from kvstate.reducer import apply as pure_apply
from kvstate.state import State
from kvstate.transient import block, pages, rows, tree
from kvstate.transient.state import TransientState, freeze, thaw

Rule = Callable[[TransientState, Any], bool]

RULES: dict[type[ev.Event], Rule] = {
    ev.ReqAlloc: rows.req_alloc,
    ev.ReqFree: rows.req_free,
    ev.Allocate: pages.allocate,
    ev.Append: pages.append,
    ev.Assign: pages.assign,
    ev.Truncate: pages.truncate,
    ev.Free: pages.free,
    ev.Share: pages.share,
    ev.Copy: pages.copy,
    ev.Insert: tree.insert,
    ev.Split: tree.split,
    ev.Touch: tree.touch,
    ev.Lock: tree.lock,
    ev.Unlock: tree.unlock,
    ev.Evict: tree.evict,
}

# Block mode (vLLM): the six block events and request opening.  Radix events on a
# block-mode state are rare (the vLLM front end never emits them) and go to the reducer.
BLOCK_RULES: dict[type[ev.Event], Rule] = {
    ev.ReqAlloc: rows.req_alloc,
    evb.BlockAlloc: block.block_alloc,
    evb.BlockHold: block.block_hold,
    evb.BlockRelease: block.block_release,
    evb.BlockCache: block.block_cache,
    evb.BlockUncache: block.block_uncache,
    evb.BlockClear: block.block_clear,
}


def rules_for(mode: str) -> dict[type[ev.Event], Rule]:
    """The transient rules of a geometry mode (``"radix"`` or ``"block"``)."""
    return BLOCK_RULES if mode == "block" else RULES


class TransientApplier:
    """Fold events into a mutable state (radix or block mode); freeze on demand."""

    def __init__(self, state: State) -> None:
        self.rules = rules_for(state.geometry.mode)
        # The live mutable state: read it, never write it (the rules own it).  A fallback
        # replaces it with a fresh one, so re-read it after ``apply``.
        self.transient: TransientState = thaw(state)
        self._frozen = state  # valid while its seq equals the transient's
        self.fallbacks = 0  # events the pure reducer applied (declined by a transient rule)

    @property
    def seq(self) -> int:
        return self.transient.seq

    def apply(self, event: ev.Event) -> None:
        """Apply one event; raises ``InvalidEvent`` (state unchanged) like ``reducer.apply``."""
        rule = self.rules.get(type(event))
        if rule is not None and rule(self.transient, event):
            self.transient.seq += 1
            return
        self.fallbacks += 1  # a rule declined: the pure reducer decides, on a frozen copy
        after = pure_apply(self.state(), event)  # raises for an invalid event; nothing changed
        self.transient = thaw(after)
        self._frozen = after

    def state(self) -> State:
        """The current state, frozen (cached until the next ``apply``)."""
        if self._frozen.seq != self.transient.seq:
            self._frozen = freeze(self.transient)
        return self._frozen
