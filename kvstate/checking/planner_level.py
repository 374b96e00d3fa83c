"""The planner-level search: every request a user could make, through the planner.

A world is the core ``State`` plus the front end's per-request cursors
(tokens so far, prompt length, protected length, locked node), which SGLang
keeps on ``Req``.  Commands, for every open request and every prompt of the
scope's lengths over its vocabulary:

``admit(prompt)``   row from the stack, ``plan_match``, lock, write the matched
                    slots, ``plan_extend`` to the prompt length (may evict)
``extend(token)``   ``plan_extend`` by one page of copies of ``token`` (a prefill
                    chunk: fills the partial page first; may evict)
``decode(token)``   ``plan_decode`` one token (may evict)
``checkpoint``      ``plan_checkpoint`` (SGLang ``cache_unfinished_req``)
``finish``          ``plan_release(checkpoint=True)`` (``cache_finished_req``)
``retract``         ``plan_release(checkpoint=False)``
``evict``           ``plan_evict`` of one page of tokens

Edge checks: every event a plan emits must be accepted by the rules
(``planner_valid``) and agree with the spec model (``refines``) and every
TRANSITIONS property; an allocation that reports out-of-memory while free
pages plus evictable tree pages would cover it fails ``no_false_oom``.

Eviction victims and free-list placement come from an ``EvictionPolicy``
(``kvstate.planner.policy``; SGLang's LRU by default).  Every answer it gives
is checked before the planner uses it (``policy_props``: ``victims_evictable``,
``victims_enough``, ``victims_minimal``, and ``policy_deterministic``: each
question is asked twice).  Each world carries its own copy of the policy,
shown the events of every plan on its path (``observe``), as the simulator
does; worlds are still identified by their state alone, so a policy that
keeps history is checked with the first history that reaches each state.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from itertools import product
from typing import Any

import attrs

from kvstate import events as ev
from kvstate.backends.persistent import apply_valid as apply
from kvstate.checking.levels import Step, check_refinement, edge_checks, geometry_of
from kvstate.checking.policy_props import check_victims
from kvstate.checking.scopes import Scope
from kvstate.checking.views import planner_view
from kvstate.errors import InvalidEvent
from kvstate.planner.alloc import new_pages_for_extend, plan_decode, plan_extend
from kvstate.planner.builder import Plan, PlanBuilder
from kvstate.planner.evict import Victims, plan_evict_nodes
from kvstate.planner.policy import EvictionPolicy, LeafLRU, require_policy
from kvstate.planner.requests import RequestCursor, plan_checkpoint, plan_release
from kvstate.planner.tree_ops import plan_match
from kvstate.state import ROOT, State, initial_state, path_to_root


@attrs.frozen
class Cursor:
    row: int
    tokens: tuple[int, ...]
    prompt_len: int
    protected_len: int
    last_node: int

    def core(self) -> RequestCursor:
        return RequestCursor(self.row, self.protected_len, self.last_node)


@attrs.frozen
class World:
    state: State
    cursors: tuple[Cursor, ...]  # sorted by row
    policy: EvictionPolicy = attrs.field(eq=False)  # this world's own copy, with its path's history


class _Failed(Exception):
    def __init__(self, name: str, message: str, events: tuple[ev.Event, ...]) -> None:
        super().__init__(message)
        self.name, self.message, self.events = name, message, events


def freeable_pages(state: State) -> int:
    """Free pages plus tree pages eviction could release (unlocked nodes, pages nobody else holds)."""
    return len(state.free_pages) + sum(
        1 for nid, node in state.nodes.items() if nid != ROOT and node.lock_ref == 0
        for page in node.pages if page not in state.holders)


class PlannerLevel:
    def __init__(self, scope: Scope, policy: EvictionPolicy | None = None, *,
                 check_model: bool = True) -> None:
        self.scope = scope
        self.policy = LeafLRU() if policy is None else require_policy(policy)
        self.check_model = check_model
        self.geometry = geometry_of(scope)
        vocab = range(1, scope.vocab + 1)
        self.prompts = [p for n in scope.prompt_lengths for p in product(vocab, repeat=n)]

    def initial(self) -> World:
        return World(initial_state(self.geometry), (), copy.deepcopy(self.policy))

    def state(self, world: World) -> State:
        return world.state

    def world_checks(self, world: World) -> list[tuple[str, str]]:
        """Planner-level ALWAYS: each node is locked once per request whose locked path covers it."""
        expected: dict[int, int] = {}
        for cursor in world.cursors:
            for node_id in path_to_root(world.state.nodes, cursor.last_node):
                expected[node_id] = expected.get(node_id, 0) + 1
        actual = {n: node.lock_ref for n, node in world.state.nodes.items()
                  if n != ROOT and node.lock_ref}
        out = []
        if actual != expected:
            out.append(("locks_match_requests", f"lock_ref {actual} but open requests lock {expected}"))
        out += self._prefix_content(world)
        return out

    def _prefix_content(self, world: World) -> list[tuple[str, str]]:
        """Every request's protected prefix is the tree path that spells its own tokens."""
        state, size = world.state, self.geometry.page_size
        out = []
        for cursor in world.cursors:
            path = list(reversed(list(path_to_root(state.nodes, cursor.last_node))))
            key = tuple(t for n in path for t in state.nodes[n].key)
            pages = [p for n in path for p in state.nodes[n].pages]
            table = list(state.requests[cursor.row].pages)
            if key != cursor.tokens[: len(key)] or len(key) < cursor.protected_len:
                out.append(("prefix_hits_match_tokens",
                            f"row {cursor.row} locks a path spelling {list(key)}, "
                            f"its tokens are {list(cursor.tokens)}"))
            elif table[: cursor.protected_len // size] != pages[: cursor.protected_len // size]:
                out.append(("prefix_hits_match_tokens",
                            f"row {cursor.row} maps {table} but its cached prefix is {pages}"))
        return out

    def view(self, world: World) -> bytes:
        extra = [[c.row, list(c.tokens), c.prompt_len, c.protected_len] for c in world.cursors]
        return planner_view(world.state, extra, tuple(c.last_node for c in world.cursors))

    # -- commands ---------------------------------------------------------------------
    def commands(self, world: World) -> Iterator[tuple[str, Any]]:
        kinds = set(self.scope.kinds)
        state = world.state
        if "admit" in kinds and len(state.free_rows) > 0:
            for prompt in self.prompts:
                yield f"admit{list(prompt)}", ("admit", prompt)
        for cursor in world.cursors:
            if "extend" in kinds:
                for token in range(1, self.scope.vocab + 1):
                    yield f"extend(row={cursor.row}, token={token})", ("extend", cursor, token)
            if "decode" in kinds:
                for token in range(1, self.scope.vocab + 1):
                    yield f"decode(row={cursor.row}, token={token})", ("decode", cursor, token)
            for name in ("checkpoint", "finish", "retract"):
                if name in kinds:
                    yield f"{name}(row={cursor.row})", (name, cursor)
        if "evict" in kinds:
            yield "evict(one page)", ("evict",)

    def expand(self, world: World) -> Iterator[Step]:
        for label, command in self.commands(world):
            try:
                outcome = self._run(world, command)
            except _Failed as failed:
                yield Step(label, failed.events, None, ((failed.name, failed.message),))
                continue
            if outcome is None:
                continue  # a correct out-of-memory: nothing happens
            plan, cursors, policy = outcome
            violations = self._check_events(world.state, plan.events)
            yield Step(label, plan.events, World(plan.state, cursors, policy), tuple(violations))

    def _check_events(self, state: State, events: tuple[ev.Event, ...]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for event in events:
            after = apply(state, event)
            if self.check_model:
                out += check_refinement(state, event, after, None)
            out += edge_checks(state, event, after)
            state = after
        return out

    def _run(self, world: World, command: tuple[Any, ...]
             ) -> tuple[Plan[Any], tuple[Cursor, ...], EvictionPolicy] | None:
        builder = PlanBuilder(world.state)
        policy = copy.deepcopy(world.policy)  # siblings must not see each other's history
        try:
            cursors = self._plan(builder, world, command, policy)
        except InvalidEvent as exc:
            raise _Failed("planner_valid", f"the planner emitted a rejected event: {exc}",
                          tuple(builder.events) + (exc.event,)) from None
        if cursors is None:
            return None
        plan = builder.done(None)
        policy.observe(plan.events)
        return plan, tuple(sorted(cursors, key=lambda c: c.row)), policy

    # -- asking the policy: every answer is checked before the planner uses it ----------
    def _at_head(self, policy: EvictionPolicy, builder: PlanBuilder) -> bool:
        first, second = policy.at_head(builder.state), policy.at_head(builder.state)
        if first != second:
            raise _Failed("policy_deterministic", f"at_head(state) answered {first!r}, then "
                                                  f"{second!r} on the same state",
                          tuple(builder.events))
        return bool(first)

    def _victims(self, policy: EvictionPolicy, builder: PlanBuilder) -> Victims:
        """``policy.victims`` for the planner; a broken rule stops the step with its name."""
        def select(state: State, num_tokens: int) -> Sequence[int]:
            first = list(policy.victims(state, num_tokens))
            second = list(policy.victims(state, num_tokens))
            if first != second:
                raise _Failed("policy_deterministic",
                              f"victims(state, {num_tokens}) answered {first}, then {second} "
                              "on the same state", tuple(builder.events))
            problem = check_victims(state, num_tokens, first)
            if problem is not None:
                raise _Failed(problem[0], problem[1], tuple(builder.events))
            return first

        return select

    def _oom(self, builder: PlanBuilder, needed: int, what: str) -> None:
        freeable = freeable_pages(builder.state)
        if needed <= freeable:
            raise _Failed("no_false_oom", f"{what} reported out of memory needing {needed} pages "
                                          f"while {freeable} could be made free",
                          tuple(builder.events))

    def _plan(self, builder: PlanBuilder, world: World, command: tuple[Any, ...],
              policy: EvictionPolicy) -> list[Cursor] | None:
        size = self.geometry.page_size
        state = world.state
        at_head = self._at_head(policy, builder)
        victims = self._victims(policy, builder)
        others = [c for c in world.cursors if len(command) < 2 or c is not command[1]]
        kind = command[0]
        if kind == "admit":
            prompt = command[1]
            row = state.free_rows.head(1)[0]
            builder.emit(ev.ReqAlloc((row,)))
            matched = plan_match(builder, prompt, limit=len(prompt) - 1)
            if matched.last_node != ROOT:
                builder.emit(ev.Lock(matched.last_node))
            if matched.length:
                builder.emit(ev.Assign(row, 0, matched.slots))
            slots = plan_extend(builder, [(row, len(prompt))], at_head=at_head, victims=victims)
            if slots is None:
                self._oom(builder, new_pages_for_extend(size, matched.length, len(prompt)), "admit")
                return None
            return others + [Cursor(row, tuple(prompt), len(prompt), matched.length,
                                    matched.last_node)]
        if kind == "extend":
            cursor, token = command[1], command[2]
            length = len(cursor.tokens) + size
            if length > self.geometry.row_width:
                return None
            slots = plan_extend(builder, [(cursor.row, length)], at_head=at_head, victims=victims)
            if slots is None:
                self._oom(builder, new_pages_for_extend(size, len(cursor.tokens), length), "extend")
                return None
            return others + [attrs.evolve(cursor, tokens=cursor.tokens + (token,) * size)]
        if kind == "decode":
            cursor, token = command[1], command[2]
            if len(cursor.tokens) >= self.geometry.row_width:
                return None
            decode = plan_decode(builder, [cursor.row], at_head=at_head, victims=victims)
            if decode is None:
                needed = 1 if state.requests[cursor.row].allocated % size == 0 else 0
                self._oom(builder, needed, "decode")
                return None
            return others + [attrs.evolve(cursor, tokens=cursor.tokens + (token,))]
        if kind == "checkpoint":
            cursor = command[1]
            new = plan_checkpoint(builder, cursor.core(), cursor.tokens,
                                  prompt_len=cursor.prompt_len, up_to=len(cursor.tokens),
                                  at_head=at_head)
            return others + [attrs.evolve(cursor, protected_len=new.protected_len,
                                          last_node=new.last_node)]
        if kind in ("finish", "retract"):
            cursor = command[1]
            plan_release(builder, cursor.core(), cursor.tokens, prompt_len=cursor.prompt_len,
                         owned=len(cursor.tokens), checkpoint=kind == "finish", at_head=at_head)
            return others
        if kind == "evict":
            if not plan_evict_nodes(builder, victims(state, size), at_head=at_head):
                return None
            return list(world.cursors)
        raise ValueError(f"unknown command {kind!r}")
