"""``Request``: the token history of one vLLM request and its block hashes.

The front end's stand-in for ``vllm.v1.request.Request``, reduced to what the
KV-cache manager reads.  It owns (and mutates, through
:meth:`Request.append_output_token_ids`) its token list; the scheduler owns
and sets ``num_computed_tokens``, ``num_in_flight_tokens`` and
``num_preemptions`` (docs/vllm.md, "The scheduler loop").  It keeps
``block_hashes`` current:
every full block is hashed eagerly, chained as vLLM 0.33 does, with the
request's tagged extra keys.  Alongside the hashes it keeps each full block's
tokens and extra keys (``block_keys``), which are what the prefix tree is
keyed by: a 64-bit or even 256-bit hash is never the identity on its own.

For a hybrid model each KV-cache group caches along its own chain:
:meth:`Request.group_chain` gives group ``g``'s view (``GroupChain``), the
same blocks with ``("group", g)`` leading their extra keys, so each group's
blocks are their own path in the prefix tree.

Everything a request carries into core events is checked here, at the API
boundary: token ids are ints in ``0..2**63-1`` (the int64 the core's events
and vLLM's tensors hold), names are strings of at most ``MAX_NAME_CHARS``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import islice, repeat
from typing import Any

from kvstate.events import MAX_ID, MAX_NAME_CHARS
from kvstate.state import block_child_key
from kvstate.vllm.hashing import (
    HashAlgo,
    MultiModalSpan,
    block_extra_keys,
    hash_int_block,
    none_hash,
)


class Request:
    """A request's tokens, computed-token cursor and eagerly computed block hashes.

    ``hash_seed`` plays ``PYTHONHASHSEED``'s role (None: vLLM 0.33's fixed
    default).  ``lora_path`` and ``lora_id`` complete the LoRA identity
    (vLLM hashes the name and the path, and publishes ``lora_id`` in events).
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        block_size: int,
        hash_seed: str | int | None = None,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        *,
        lora_path: str = "",
        lora_id: int | None = None,
        mm_spans: Sequence[MultiModalSpan] = (),
        hash_algo: HashAlgo = "sha256_cbor",
        skip_reading_prefix_cache: bool = False,
    ) -> None:
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        for label, name in (("request_id", request_id), ("lora_name", lora_name),
                            ("lora_path", lora_path), ("cache_salt", cache_salt),
                            *(("mm identifier", span.identifier) for span in mm_spans)):
            _check_name(label, name)
        self.request_id = request_id
        self.block_size = block_size
        self.hash_seed = hash_seed
        self.hash_algo: HashAlgo = hash_algo
        self.lora_name = lora_name
        self.lora_path = lora_path
        self.lora_id = lora_id
        self.cache_salt = cache_salt
        self.mm_spans = tuple(sorted(mm_spans, key=lambda span: span.offset))
        self.skip_reading_prefix_cache = skip_reading_prefix_cache
        self.prompt_token_ids = _tokens(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0  # set by the scheduler
        self.num_in_flight_tokens = 0  # set by the scheduler (async scheduling)
        self.num_preemptions = 0  # set by the scheduler; read by prefix-cache statistics
        # Set by the scheduler from get_computed_blocks (hybrid models: the uncached shared
        # prefix to keep a checkpoint at); read by caching and the Mamba chunk split.
        self.shared_prefix_boundary = 0
        self.block_hashes: list[bytes] = []
        self.block_extra_keys: list[tuple[Any, ...] | None] = []
        self.block_keys: list[tuple[Any, ...]] = []  # prefix-tree child keys of full blocks
        self.block_token_keys: list[tuple[int, ...]] = []  # each full block's tokens, as a tuple
        self._none_hash = none_hash(hash_seed, hash_algo)
        self._chains: dict[int, GroupChain] = {}
        self._update_block_hashes()

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output_token_ids(self, token_ids: int | Iterable[int]) -> None:
        """Append sampled tokens and hash any block they complete (mutates; commits nothing)."""
        if type(token_ids) is int and 0 <= token_ids <= MAX_ID:  # one token: a decode step
            self.output_token_ids.append(token_ids)
            self.all_token_ids.append(token_ids)
        else:
            new = [_token(token_ids)] if isinstance(token_ids, int) else _tokens(token_ids)
            self.output_token_ids.extend(new)
            self.all_token_ids.extend(new)
        if len(self.all_token_ids) >= (len(self.block_hashes) + 1) * self.block_size:
            self._update_block_hashes()  # a block was completed

    def block_tokens(self, index: int) -> tuple[int, ...]:
        """Tokens of block ``index`` (full or partial)."""
        start = index * self.block_size
        return tuple(self.all_token_ids[start:start + self.block_size])

    def group_chain(self, group: int) -> GroupChain:
        """KV-cache group ``group``'s view of the full blocks (kept, and extended, per group)."""
        chain = self._chains.get(group)
        if chain is None:
            chain = self._chains[group] = GroupChain(self, group)
        return chain

    def _update_block_hashes(self) -> None:
        size = self.block_size
        tokens = self.all_token_ids
        start = len(self.block_hashes) * size
        parent = self.block_hashes[-1] if self.block_hashes else self._none_hash
        if start + size > len(tokens):
            return  # no block completed (most decode steps)
        has_extras = bool(self.lora_name or self.mm_spans or self.cache_salt)
        algo = self.hash_algo
        while start + size <= len(tokens):
            end = start + size
            key = tuple(tokens[start:end])
            extra = (block_extra_keys(start, end, lora_name=self.lora_name,
                                      lora_path=self.lora_path, mm_spans=self.mm_spans,
                                      cache_salt=self.cache_salt)
                     if has_extras else None)
            parent = hash_int_block(parent, key, extra, algo)  # tokens checked on entry
            self.block_hashes.append(parent)
            self.block_extra_keys.append(extra)
            self.block_keys.append(key if extra is None else block_child_key(key, extra))
            self.block_token_keys.append(key)
            start = end

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, hashed_blocks={len(self.block_hashes)})")


class GroupChain:
    """One KV-cache group's chain of a request: the request's full blocks, hashes and tokens,
    with ``("group", group)`` leading each block's extra keys (so the tree key differs per
    group while the vLLM hash does not).  Reads the request's own lists (which only grow),
    not the request, so a request and its chains form no reference cycle; extends its own key
    lists lazily as the request grows."""

    __slots__ = ("_block_size", "_extras", "_keys", "_own_extras", "_plain", "_plain_suffix",
                 "_tag", "_tokens", "block_hashes", "block_token_keys", "group")

    def __init__(self, request: Request, group: int) -> None:
        self.group = group
        self.block_hashes: Sequence[bytes] = request.block_hashes
        # Each full block's tokens as a tuple (the request's own objects, shared).
        self.block_token_keys: Sequence[tuple[int, ...]] = request.block_token_keys
        self._own_extras = request.block_extra_keys
        self._tokens = request.all_token_ids
        self._block_size = request.block_size
        self._tag = ("group", group)
        # One extra-keys tuple per group for every block without keys of its own, shared by
        # all requests (the rules reuse the child-key suffix of a repeated object), and that
        # suffix (block_child_key's).
        self._plain, self._plain_suffix = _plain_extra(group)
        self._keys: list[tuple[Any, ...]] = []
        self._extras: list[tuple[Any, ...]] = []

    @property
    def block_keys(self) -> Sequence[tuple[Any, ...]]:
        self._extend()
        return self._keys

    @property
    def block_extra_keys(self) -> Sequence[tuple[Any, ...]]:
        self._extend()
        return self._extras

    def block_tokens(self, index: int) -> tuple[int, ...]:
        start = index * self._block_size
        return tuple(self._tokens[start:start + self._block_size])

    def _extend(self) -> None:
        blocks = self.block_token_keys
        start = len(self._keys)
        if start == len(blocks):
            return
        own_extras = self._own_extras
        if not any(islice(own_extras, start, None)):  # no block has keys of its own
            self._keys.extend(map(tuple.__add__, islice(blocks, start, None),
                                  repeat((self._plain_suffix,))))
            self._extras.extend(repeat(self._plain, len(blocks) - start))
            return
        plain = self._plain
        plain_suffix = (self._plain_suffix,)
        for index in range(start, len(blocks)):
            own = own_extras[index]
            if own is None:
                self._extras.append(plain)
                self._keys.append(blocks[index] + plain_suffix)
            else:
                extra = (self._tag, *own)
                self._extras.append(extra)
                self._keys.append(block_child_key(blocks[index], extra))


_PLAIN_EXTRAS: dict[int, tuple[tuple[tuple[str, int]], str]] = {}


def request_id_of(request: Any) -> str:
    """The id a ``free`` takes: a ``Request``'s, or a str given as it is (``TypeError`` for
    anything else)."""
    if isinstance(request, str):
        return request
    if isinstance(request, Request):
        return request.request_id
    raise TypeError(f"expected a Request or a request id (str), got {type(request).__name__}")


def _plain_extra(group: int) -> tuple[tuple[tuple[str, int]], str]:
    found = _PLAIN_EXTRAS.get(group)
    if found is None:
        plain = (("group", group),)
        found = _PLAIN_EXTRAS[group] = (plain, repr(plain))
    return found


_INT_TYPE = frozenset({int})  # exactly int: a bool is refused


def _tokens(values: Iterable[Any]) -> list[int]:
    """``values`` as a list of token ids; ``TypeError`` / ``ValueError`` (nothing kept) if not."""
    tokens = list(values)
    if set(map(type, tokens)) <= _INT_TYPE:  # the common case: C-speed checks only
        if tokens and (min(tokens) < 0 or max(tokens) > MAX_ID):
            for token in tokens:
                _token(token)
        return tokens
    return [_token(token) for token in tokens]


def _token(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"token ids must be ints, got {value!r}")
    if not 0 <= value <= MAX_ID:
        raise ValueError(f"token id {value} is outside 0..2**63-1 (int64)")
    return value


def _check_name(label: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise TypeError(f"{label} must be a str, got {type(value).__name__}")
    if len(value) > MAX_NAME_CHARS:
        raise ValueError(f"{label} is {len(value)} characters, more than {MAX_NAME_CHARS}")
    try:  # names go into events and fingerprints as UTF-8
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{label} {value!r} is not valid Unicode text: {exc.reason}") from None
