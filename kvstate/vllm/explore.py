"""A vLLM search level for the explorer: every front-end call, exhaustively, in a tiny scope.

Plugs into ``kvstate.checking.explorer.explore`` (it implements the
``Level`` protocol).  A world is the block-mode core ``State`` plus the
scheduler-side cursors of each running request (its tokens, computed tokens
and vLLM's ``num_cached_block``).  Commands, for every running request and
every token of the scope's vocabulary:

``admit(prompt)``  ``get_computed_blocks`` + ``allocate_slots`` (a refusal is a step too)
``decode(r, t)``   append token ``t`` and ``allocate_slots(r, 1)`` (refused: preempt = free)
``free(r)``        ``KVCacheManager.free``
``evict(b)``       ``evict_blocks({b})`` of a cached block
``reset``          ``reset_prefix_cache``

Each command runs on a manager rebuilt from the world over a persistent-backend
engine (worlds are values sharing structure, so the explorer can keep
millions).  Edge checks: the predictor equals what the allocation consumed
(vLLM reference 1.9 item 12), a refused allocation changes nothing (item
11), hits are block multiples below ``num_tokens``.
State checks: ``kvstate.invariants`` (via the explorer) and, here, that each
cursor matches its core table.  Pure except for the scratch managers it builds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from itertools import product
from typing import Any

import attrs

from kvstate.checking.levels import Step
from kvstate.checking.scopes import Scope
from kvstate.engine import Engine
from kvstate.events import Event
from kvstate.planner.block_hits import Running
from kvstate.state import Geometry, State, initial_state
from kvstate.vllm.manager import KVCacheManager
from kvstate.vllm.request import Request


@attrs.frozen
class Cursor:
    request_id: str
    tokens: tuple[int, ...]
    num_computed: int
    num_cached: int | None


@attrs.frozen
class World:
    state: State
    cursors: tuple[Cursor, ...]
    next_id: int = 0


def vllm_scope(name: str = "vllm-tiny", *, num_blocks: int = 4, block_size: int = 1,
               vocab: int = 2, max_depth: int = 5, prompt_lengths: tuple[int, ...] = (1, 2),
               ) -> Scope:
    """A scope for :class:`VllmLevel` (``num_pages`` counts usable blocks: ``num_blocks - 1``)."""
    return Scope(name, "planner", num_pages=num_blocks - 1, page_size=block_size, num_rows=0,
                 vocab=vocab, max_depth=max_depth, kinds=("admit", "decode", "finish", "evict"),
                 prompt_lengths=prompt_lengths, symmetry=False,
                 description="vLLM 0.33 front end (kvstate.vllm)")


class VllmLevel:
    """Worlds are :class:`World`; steps are vLLM front-end calls."""

    def __init__(self, scope: Scope, *, sliding_window: int | None = None,
                 max_running: int = 2) -> None:
        self.scope = scope
        self.sliding_window = sliding_window
        self.max_running = max_running
        self.num_blocks = scope.num_pages + 1
        self.max_model_len = (scope.num_pages + 2) * scope.page_size
        self.geometry = _geometry(self.num_blocks, scope.page_size, self.max_model_len)

    def initial(self) -> World:
        return World(initial_state(self.geometry), ())

    def state(self, world: World) -> State:
        return world.state

    def view(self, world: World) -> bytes:
        digest = hashlib.blake2b(world.state.fingerprint(), digest_size=16)
        for cursor in world.cursors:
            digest.update(repr((cursor.tokens, cursor.num_computed, cursor.num_cached)).encode())
        return digest.digest()

    def world_checks(self, world: World) -> list[tuple[str, str]]:
        found = []
        for cursor in world.cursors:
            record = world.state.requests.get(cursor.request_id)
            pages = 0 if record is None else len(record.pages)
            if pages * self.scope.page_size < cursor.num_computed:
                found.append(("vllm_cursor", f"{cursor.request_id} computed {cursor.num_computed} "
                                             f"tokens but maps only {pages} blocks"))
        return found

    # -- expansion -----------------------------------------------------------------------
    def _manager(self, world: World) -> tuple[KVCacheManager, dict[str, Request]]:
        engine = Engine(state=world.state, backend="persistent", keep_events=False)
        manager = KVCacheManager(self.num_blocks, self.scope.page_size, self.max_model_len,
                                 sliding_window=self.sliding_window, engine=engine)
        requests = {}
        for cursor in world.cursors:
            request = Request(cursor.request_id, list(cursor.tokens), self.scope.page_size)
            request.num_computed_tokens = cursor.num_computed
            requests[cursor.request_id] = request
            if cursor.num_cached is not None:
                manager.running[cursor.request_id] = Running(cursor.num_cached)
        return manager, requests

    def _run(self, world: World, label: str, command: Any) -> Step:
        manager, requests = self._manager(world)
        events: list[Event] = []
        manager.engine.subscribe(lambda event, _state: events.append(event))
        violations: list[tuple[str, str]] = []
        next_id = command(manager, requests, violations)
        if next_id is None:
            next_id = world.next_id
        running = manager.running
        cursors = tuple(Cursor(rid, tuple(r.all_token_ids), r.num_computed_tokens,
                               running[rid].num_cached if rid in running else None)
                        for rid, r in sorted(requests.items()))
        after = World(manager.engine.state, cursors, next_id)
        return Step(label, tuple(events), after, tuple(violations))

    def expand(self, world: World) -> Iterator[Step]:
        vocab = range(1, self.scope.vocab + 1)
        if len(world.cursors) < self.max_running:
            for length in self.scope.prompt_lengths:
                for prompt in product(vocab, repeat=length):
                    yield self._run(world, f"admit{prompt}", self._admit(world, list(prompt)))
        for cursor in world.cursors:
            for token in vocab:
                yield self._run(world, f"decode({cursor.request_id},{token})",
                                self._decode(cursor.request_id, token))
            yield self._run(world, f"free({cursor.request_id})", self._free(cursor.request_id))
        for page in sorted(world.state.page_node):
            yield self._run(world, f"evict({page})", _evict(page))
        yield self._run(world, "reset", _reset)

    def _admit(self, world: World, prompt: list[int]) -> Any:
        rid = f"r{world.next_id}"

        def run(manager: KVCacheManager, requests: dict[str, Request],
                violations: list[tuple[str, str]]) -> int:
            request = Request(rid, prompt, self.scope.page_size)
            blocks, hit, _ = manager.get_computed_blocks(request)
            if hit % self.scope.page_size or hit > request.num_tokens - 1:
                violations.append(("vllm_hit", f"hit {hit} for {request.num_tokens} tokens"))
            before = manager.engine.state
            free_before = manager.block_pool.get_num_free_blocks()
            predicted = manager.get_num_blocks_to_allocate(rid, request.num_tokens,
                                                           blocks.blocks[0], hit)
            new = manager.allocate_slots(request, request.num_tokens - hit, hit, blocks)
            if new is None:
                if self.sliding_window is None and manager.engine.state is not before:
                    violations.append(("vllm_atomic", "a refused allocation changed the state"))
            else:
                used = free_before - manager.block_pool.get_num_free_blocks()
                if used != predicted:
                    violations.append(("vllm_predictor", f"predicted {predicted}, used {used}"))
                request.num_computed_tokens = request.num_tokens
                requests[rid] = request
            return world.next_id + 1
        return run

    @staticmethod
    def _decode(rid: str, token: int) -> Any:
        def run(manager: KVCacheManager, requests: dict[str, Request],
                violations: list[tuple[str, str]]) -> None:
            request = requests[rid]
            request.append_output_token_ids(token)
            if manager.allocate_slots(request, 1) is None:
                manager.free(requests.pop(rid))  # preempted
            else:
                request.num_computed_tokens += 1
        return run

    @staticmethod
    def _free(rid: str) -> Any:
        def run(manager: KVCacheManager, requests: dict[str, Request],
                violations: list[tuple[str, str]]) -> None:
            manager.free(requests.pop(rid))
        return run


def _evict(page: int) -> Any:
    def run(manager: KVCacheManager, requests: dict[str, Request],
            violations: list[tuple[str, str]]) -> None:
        manager.evict_blocks({page})
    return run


def _reset(manager: KVCacheManager, requests: dict[str, Request],
           violations: list[tuple[str, str]]) -> None:
    manager.reset_prefix_cache()


def _geometry(num_blocks: int, block_size: int, max_model_len: int) -> Geometry:
    blocks_per_request = -(-max_model_len // block_size) + 1
    return Geometry(num_pages=num_blocks - 1, page_size=block_size,
                    row_width=blocks_per_request * block_size, mode="block")
