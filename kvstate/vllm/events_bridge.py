"""Core block events -> vLLM KV events, and the hash of every prefix-tree node.

``NodeHashes`` is an engine listener (owned by a ``BlockPool``; it mutates
only itself) that follows ``BlockCache`` / ``BlockUncache`` / ``BlockClear``
once per committed batch and keeps each live node's chained block hash
(vLLM's ``BlockHash``, derived from the node's path: tokens and tagged extra
keys from the root down, seeded by ``NONE_HASH``), its depth, and the
reverse map hash -> node used by ``BlockPool.get_cached_block``.  With
events enabled it also queues the vLLM events the same calls produce in
vLLM 0.33:

* ``BlockCache``   -> one ``BlockStored`` (the blocks of that call; the
  parent is the logical predecessor, None at the chain start);
* ``BlockUncache`` -> one ``BlockRemoved`` per page, in order;
* ``BlockClear``   -> ``AllBlocksCleared``.

Works from a live front end (which may offer the request's block hashes as
``hints`` for the batch it is about to commit: a node at depth ``d`` is chain
position ``d - 1``) and from a replayed log alike (it then hashes each node
once).

Hybrid models: a block whose extra keys start with ``("group", g)`` (see
``kvstate.vllm.request.GroupChain``) belongs to KV-cache group ``g``; that key
is not part of its vLLM hash (vLLM pairs the hash with the group id instead,
``BlockHashWithGroupId``) and sets the events' ``group_idx``.  Untagged
blocks belong to ``group_idx`` (0 for a one-group pool).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

from kvstate.events import BlockCache, BlockClear, BlockUncache, Event
from kvstate.state import ROOT
from kvstate.vllm.hashing import (
    HashAlgo,
    block_hash_with_group_id,
    external_block_hash,
    hash_block_tokens,
    none_hash,
)
from kvstate.vllm.hashing import to_event_extra_keys as _untag
from kvstate.vllm.kv_event_types import stored_event
from kvstate.vllm.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent

GROUP_TAG = "group"  # the extra key that names a block's KV-cache group: ("group", g)
_LOW_64 = (1 << 64) - 1  # a published hash is the digest's low 64 bits (external_block_hash)


def split_group(extra: Any, default: int) -> tuple[int, Any]:
    """A block's KV-cache group and its extra keys without the group key (None when none left)."""
    if extra and extra[0][0] == GROUP_TAG:
        rest = extra[1:]
        return extra[0][1], (rest if rest else None)
    return default, extra


# A ``BlockStored`` waiting to be taken, as a plain tuple (hashes, parent hash, token ids, block
# size, lora_id, lora_name, extra keys, group): built once, when taken, with the group's spec
# kind and window if the taker names them (the manager does, the pool does not).
_Stored = tuple[tuple[int, ...], int | None, tuple[int, ...], int, int | None, str | None, Any,
                int]


Spec = tuple[str | None, int | None]  # a group's (kv_cache_spec_kind, sliding window)


class NodeHashes:
    """Digest of every live tree node, kept in step with the engine (a listener)."""

    def __init__(self, *, hash_seed: str | int | None = None, hash_algo: HashAlgo = "sha256_cbor",
                 emit_events: bool = False, group_idx: int = 0) -> None:
        self.hash_seed = hash_seed
        self.hash_algo: HashAlgo = hash_algo
        self.emit_events = emit_events
        self.group_idx = group_idx
        self.none_hash = none_hash(hash_seed, hash_algo)
        self.digest: dict[int, bytes] = {}  # node id -> 32-byte block hash
        self.parent: dict[int, int] = {}  # node id -> parent node id
        self.depth: dict[int, int] = {}  # node id -> nodes on its path from the root (itself too)
        self.group: dict[int, int] = {}  # node id -> KV-cache group
        # block hash + group id (vLLM's key) -> node id: built on first use (``node_of``), then
        # kept; a manager that never looks a hash up never pays for it.
        self._node_of: dict[bytes, int] | None = None
        # Offered by a front end for the batch it commits next (cleared when a batch ends):
        # the block hashes of the request whose chain it caches, by chain position.
        self.hints: Sequence[bytes] | None = None
        self.lora_id: int | None = None  # published lora_id of that batch's BlockStored
        self.events: list[KVCacheEvent | _Stored] = []

    @property
    def node_of(self) -> dict[bytes, int]:
        """vLLM's cache-map key (``block_hash_with_group_id``) -> node id, for live nodes."""
        found = self._node_of
        if found is None:
            group = self.group
            found = self._node_of = {
                block_hash_with_group_id(value, group.get(node_id, self.group_idx)): node_id
                for node_id, value in self.digest.items()}
        return found

    before_events = (BlockCache, BlockUncache)  # the engine calls ``before`` for these alone

    def before(self, event: Event, view: Any) -> None:
        """Hashes the event needs, from the state it applies to (it or a later event of the
        batch may prune those nodes): a ``BlockCache``'s parent, a ``BlockUncache``'s nodes."""
        kind = type(event)
        if kind is BlockCache:
            parent = event.parent  # type: ignore[attr-defined]
            if parent != ROOT and parent not in self.digest:
                self.digest_of(parent, view)
        elif kind is BlockUncache:
            for node_id in event.nodes:  # type: ignore[attr-defined]
                self.digest_of(node_id, view)

    def discard(self, event: Event) -> None:
        """Nothing to undo: a digest computed in ``before`` is true of a node that exists."""

    def after(self, events: Sequence[Event], view: Any) -> None:
        """Follow a committed batch (``view``: the state after all of it).

        Memo entries of pruned nodes are dropped only once the whole batch is
        followed: a later event of the batch (another group's eviction) may
        prune a node an earlier one touched, and still needs its hash.
        """
        pruned: list[int] = []
        try:
            for event in events:
                kind = type(event)
                if kind is BlockCache:
                    entries = event.entries  # type: ignore[attr-defined]
                    self._on_cache(event, view)  # type: ignore[arg-type]
                    last = entries[-1][0] if entries else ROOT
                    if last not in view.nodes:  # a masked tail the rules pruned at once
                        pruned.append(last)
                elif kind is BlockUncache:
                    self._on_uncache(event)  # type: ignore[arg-type]
                    pruned.extend(dict.fromkeys(event.nodes))  # type: ignore[attr-defined]
                elif kind is BlockClear:
                    self._on_clear()
            for node_id in pruned:
                self._forget_pruned(node_id, view)
        finally:
            self.hints = None
            self.lora_id = None

    def _on_clear(self) -> None:
        self.digest.clear()
        self.parent.clear()
        self.depth.clear()
        self.group.clear()
        if self._node_of is not None:
            self._node_of.clear()
        if self.emit_events:
            self.events.append(AllBlocksCleared())

    def take_events(self, specs: Sequence[Spec] | None = None) -> list[KVCacheEvent]:
        """Drain the queued vLLM events; with ``specs`` (per group), each ``BlockStored`` of a
        group in range carries that group's spec kind and window."""
        events, self.events = self.events, []
        out: list[KVCacheEvent] = []
        count = 0 if specs is None else len(specs)
        for event in events:
            if type(event) is tuple:
                hashes, parent, tokens, size, lora_id, lora_name, extras, group = event
                kind, window = specs[group] if specs is not None and 0 <= group < count \
                    else (None, None)
                if type(extras) is tuple or extras is None:  # already in stored form
                    out.append(stored_event(hashes, parent, tokens, size, lora_id, lora_name,
                                            extras, group, kind, window))
                else:
                    out.append(BlockStored(hashes, parent, tokens, size, lora_id, MEDIUM_GPU,
                                           lora_name, extras, group, kind, window))
            else:
                out.append(event)  # type: ignore[arg-type]
        return out

    def digest_of(self, node_id: int, state: Any) -> bytes | None:
        """The hash of ``node_id`` (computed from the tree path if not known yet)."""
        known = self.digest.get(node_id)
        if known is not None or node_id == ROOT:
            return known
        missing: list[int] = []  # walk up to a known ancestor (iteratively: chains are long)
        current = node_id
        while current != ROOT and current not in self.digest:
            if current not in state.nodes:
                return None
            missing.append(current)
            current = state.nodes[current].parent
        parent = self.none_hash if current == ROOT else self.digest[current]
        for current in reversed(missing):
            node = state.nodes[current]
            group, extra = split_group(node.extra, self.group_idx)
            parent = hash_block_tokens(parent, node.key, extra, hash_seed=self.hash_seed,
                                       hash_algo=self.hash_algo)
            self._remember(current, node.parent, parent, group)
        return parent

    def group_of(self, node_id: int) -> int:
        """The KV-cache group of a node whose hash is known."""
        return self.group.get(node_id, self.group_idx)

    def _remember(self, node_id: int, parent_id: int, value: bytes, group: int) -> None:
        self.digest[node_id] = value
        self.parent[node_id] = parent_id
        self.depth[node_id] = 1 if parent_id == ROOT else self.depth[parent_id] + 1
        self.group[node_id] = group
        if self._node_of is not None:
            self._node_of[block_hash_with_group_id(value, group)] = node_id

    def _on_cache(self, event: BlockCache, state: Any) -> None:
        # An offer holds for its whole batch: every BlockCache of a manager's batch caches the
        # same request (one per KV-cache group for a hybrid model); ``after`` withdraws it.
        hints = self.hints
        parent_id = event.parent
        if parent_id == ROOT:
            parent_digest, chain_parent, offset = self.none_hash, None, 0
        else:
            parent_digest = self.digest_of(parent_id, state)  # type: ignore[assignment]
            chain_parent, offset = parent_digest, self.depth[parent_id]  # it may be pruned below
        entries = event.entries
        digests: list[bytes] = []
        digest, parents, depths, groups = self.digest, self.parent, self.depth, self.group
        node_of = self._node_of
        live = state.nodes  # a node the batch pruned again (a masked tail) is not remembered
        default = group = self.group_idx
        plain_only = True  # no entry has extra keys besides its group's
        for index, (node_id, key, extra, _page) in enumerate(entries):
            if extra and extra[0][0] == GROUP_TAG:
                group, plain = extra[0][1], (extra[1:] or None)  # type: ignore[assignment]
            else:
                group, plain = default, extra
            if plain is not None:
                plain_only = False
            value = digest.get(node_id)
            if value is None:
                position = offset + index
                if hints is not None and position < len(hints):
                    value = hints[position]
                else:
                    value = hash_block_tokens(parent_digest, key, plain, hash_seed=self.hash_seed,
                                              hash_algo=self.hash_algo)
                if node_id in live:
                    digest[node_id] = value
                    parents[node_id] = parent_id
                    depths[node_id] = position + 1
                    groups[node_id] = group
                    if node_of is not None:
                        node_of[block_hash_with_group_id(value, group)] = node_id
            digests.append(value)
            parent_id, parent_digest = node_id, value
        if self.emit_events:
            self.events.append(self._stored(event, digests, chain_parent, group, plain_only))

    def _stored(self, event: BlockCache, digests: list[bytes], chain_parent: bytes | None,
                group: int, plain_only: bool) -> _Stored:
        start = event.stored_from
        entries = event.entries[start:]
        before = digests[start - 1] if start > 0 else chain_parent
        parent = None if before is None else int.from_bytes(before, "big") & _LOW_64
        hashes = [int.from_bytes(digests[index], "big") & _LOW_64
                  for index, entry in enumerate(entries, start) if entry[3]]
        if plain_only:
            extras: Any = (None,) * len(hashes) or None  # the stored form (see stored_event)
            lora_name = None
        else:
            extras = _untag([split_group(entry[2], group)[1] for entry in entries if entry[3]])
            lora_name = _lora_name(split_group(entries[0][2], group)[1]) if entries else None
        tokens = tuple(entries[0][1]) if len(entries) == 1 else \
            tuple(chain.from_iterable([entry[1] for entry in entries]))
        return (tuple(hashes), parent, tokens, len(entries[0][1]) if entries else 0,
                self.lora_id, lora_name, extras, group)

    def _on_uncache(self, event: BlockUncache) -> None:
        if self.emit_events:
            for node_id in event.nodes:
                value = self.digest.get(node_id)
                if value is None:  # a node this listener never saw being created
                    raise RuntimeError(f"no hash known for tree node {node_id}")
                self.events.append(BlockRemoved(block_hashes=[external_block_hash(value)],
                                                medium=MEDIUM_GPU,
                                                group_idx=self.group_of(node_id)))

    def _forget_pruned(self, node_id: int, state: Any) -> None:
        """Drop memo entries of ``node_id`` and ancestors the rules pruned."""
        nodes = state.nodes
        node_of = self._node_of
        while node_id != ROOT and node_id not in nodes:
            value = self.digest.pop(node_id, None)
            group = self.group.pop(node_id, self.group_idx)
            if value is not None and node_of is not None:
                key = block_hash_with_group_id(value, group)
                if node_of.get(key) == node_id:
                    del node_of[key]
            self.depth.pop(node_id, None)
            parent = self.parent.pop(node_id, None)
            if parent is None:
                return
            node_id = parent


def _lora_name(extra: Any) -> str | None:
    if not extra:
        return None
    for key in extra:
        if isinstance(key, tuple) and key and key[0] == "lora":
            return str(key[1])
    return None
