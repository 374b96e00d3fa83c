"""``IdleSteps``: the hybrid manager's shortcut for decode steps that change nothing.

Most ``allocate_slots`` calls of a decoding request change nothing: a block
fills every ``block_size`` tokens, a window or a Mamba state moves on at block
edges.  After every step that decides in full, the manager asks the planner
for the bounds within which the request's next plain steps (no hits, no
full-sequence check) are idle (``kvstate.planner.hybrid_step.idle_bounds``);
a step inside them passes ``allocate_slots``'s argument checks here and
returns at once, with no decision, no batch and no event (there would be
none).  Any step outside the bounds, or with arguments a check would refuse,
goes the full way, which raises as before.

``IdleSteps`` owns only those bounds, per request.  The manager drops a
request's bounds in every call that may change its tables or cursors.  As an
engine listener it drops all of them when a held block leaves the cache or
the cache is cleared, whoever committed it (the manager's ``evict_blocks``,
or a call straight to its pool).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.events import BlockClear, BlockUncache, Event
from kvstate.planner.hybrid_hits import GroupCursor, HybridLayout
from kvstate.planner.hybrid_step import idle_bounds


class IdleSteps:
    """Per request: the ``Request`` object and its ``idle_bounds`` (need_hi, main_hi, cache_lo,
    cache_hi, remove_hi).  ``covered``: the manager's map of the tokens each request's last
    allocation gave slots to (read and advanced here, as ``allocate_slots`` does)."""


    def __init__(self, layout: HybridLayout, max_model_len: int, covered: dict[str, int]) -> None:
        self.layout = layout
        self.max_model_len = max_model_len
        self.covered = covered
        self._bounds: dict[str, tuple[Any, ...]] = {}

    def take(self, request: Any, num_new_tokens: int, num_new_computed_tokens: int,
             num_lookahead_tokens: int) -> bool | None:
        """True (and the step taken: ``covered`` advanced) when this plain step is idle by the
        request's bounds and ``check_allocation`` would accept it.  False: the request has
        bounds and this step is past them (or its arguments are refused): decide in full, the
        step most likely changes something.  None: no bounds known for the request."""
        request_id = request.request_id
        bounds = self._bounds.get(request_id)
        if bounds is None or bounds[0] is not request:
            return None
        computed = request.num_computed_tokens
        in_flight = request.num_in_flight_tokens
        if type(num_new_tokens) is not int or type(num_new_computed_tokens) is not int or \
                type(num_lookahead_tokens) is not int or type(computed) is not int or \
                type(in_flight) is not int or num_new_tokens <= 0 or \
                num_new_computed_tokens != 0 or num_lookahead_tokens < 0 or in_flight < 0:
            return False
        _, need_hi, main_hi, cache_lo, cache_hi, remove_hi = bounds
        main_tokens = computed + num_new_tokens
        if main_tokens > main_hi or computed - in_flight > remove_hi:
            return False
        need_slots = main_tokens + num_lookahead_tokens
        max_model_len = self.max_model_len
        if need_slots > max_model_len:
            if main_tokens > max_model_len:
                return False
            need_slots = max_model_len
        if need_slots > need_hi:
            return False
        num_tokens = len(request.all_token_ids)  # ``num_tokens`` without a property call
        cache_upto = main_tokens if main_tokens < num_tokens else num_tokens
        if not cache_lo <= cache_upto <= cache_hi or computed < self.covered.get(request_id, 0):
            return False
        self.covered[request_id] = cache_upto
        return True

    def remember(self, state: Any, holders: Sequence[str], request: Any,
                 cursors: Sequence[GroupCursor], cache_upto: int, remove_upto: int) -> None:
        """Bounds for the request after a step decided in full (none kept if there are none)."""
        bounds = idle_bounds(state, self.layout, holders, request, cursors, cache_upto,
                             remove_upto)
        if bounds is not None:
            self._bounds[request.request_id] = (request, *bounds)

    before_events = (BlockUncache, BlockClear)  # the engine calls ``before`` for these alone

    def before(self, event: Event, view: Any) -> None:
        """Engine listener: a held block about to be uncached, or the cache about to be
        cleared, ends every bound (dropping bounds is always safe, so an event refused
        after this needs no undo)."""
        if self._bounds and (type(event) is BlockClear or (
                isinstance(event, BlockUncache) and
                any(page in view.holders for page in event.pages))):
            self._bounds.clear()

    def discard(self, event: Event) -> None:
        """Nothing to undo (see ``before``)."""

    def after(self, events: Sequence[Event], view: Any) -> None:
        """Nothing to follow: ``before`` saw what matters."""

    def drop(self, request_id: str) -> None:
        self._bounds.pop(request_id, None)

    def clear(self) -> None:
        self._bounds.clear()
