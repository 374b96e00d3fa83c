"""Fact events: one frozen attrs class per change to the cache state.

An event records an outcome (which pages, which rows, which node id, which
time) so replaying it never consults policy.  Every event encodes to plain
msgpack types as ``[tag, version, *fields]`` in declaration order; the tag is
a stable two-letter code and ``VERSION`` bumps when a field changes meaning
(old versions are upcast by the log reader).  Events are immutable values.

Request ids are row numbers (``int``, SGLang front end) or names (``str``).
Token slots are ``page * page_size + offset``; page 0 is the padding sink.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypeVar

import attrs

RequestId = int | str
E = TypeVar("E", bound="Event")

EVENT_TYPES: dict[str, type[Event]] = {}


def ints(values: Iterable[Any]) -> tuple[int, ...]:
    return tuple(map(int, values))


def request_ids(values: Iterable[Any]) -> tuple[RequestId, ...]:
    return tuple(v if isinstance(v, str) else int(v) for v in values)


def slot_items(values: Iterable[Any]) -> tuple[tuple[RequestId, tuple[int, ...]], ...]:
    return tuple((r if type(r) is str else int(r), tuple(map(int, s))) for r, s in values)


def commit_items(values: Iterable[Any]) -> tuple[tuple[RequestId, int], ...]:
    return tuple((r if type(r) is str else int(r), int(n)) for r, n in values)


def _request_id(value: Any) -> RequestId:
    return value if isinstance(value, str) else int(value)


class Event:
    """Base of all events.  Subclasses set ``TAG`` and are attrs frozen classes."""

    TAG: ClassVar[str]
    VERSION: ClassVar[int] = 1

    def to_fields(self) -> list[Any]:
        """Field values as plain msgpack types (tuples become lists)."""
        return [_plain(getattr(self, f.name)) for f in attrs.fields(type(self))]  # type: ignore[arg-type]

    @classmethod
    def trusted(cls: type[E], *values: Any) -> E:
        """Build without running converters: for planner hot paths whose values
        already have the exact field types (tuples of ints, int/str ids)."""
        instance = object.__new__(cls)
        for field, value in zip(attrs.fields(cls), values, strict=True):  # type: ignore[arg-type]
            object.__setattr__(instance, field.name, value)
        return instance

    @classmethod
    def from_fields(cls: type[E], fields: list[Any]) -> E:
        names = [f.name for f in attrs.fields(cls)]  # type: ignore[arg-type]
        if len(fields) != len(names):
            raise ValueError(f"{cls.__name__} takes {len(names)} fields, got {len(fields)}")
        return cls(**dict(zip(names, fields, strict=True)))


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def event(tag: str) -> Callable[[type[E]], type[E]]:
    """Register an event class under a stable tag (must be unique)."""

    def register(cls: type[E]) -> type[E]:
        if tag in EVENT_TYPES:
            raise ValueError(f"event tag {tag!r} already used by {EVENT_TYPES[tag].__name__}")
        cls.TAG = tag
        EVENT_TYPES[tag] = cls
        return cls

    return register


# -- request rows -------------------------------------------------------------
@event("ra")
@attrs.frozen
class ReqAlloc(Event):
    """Open requests: int ids take those request rows, str ids are named requests."""

    requests: tuple[RequestId, ...] = attrs.field(converter=request_ids)


@event("rf")
@attrs.frozen
class ReqFree(Event):
    """Close requests; rows go back on top of the row stack in the given order.

    Pages only the request held become DETACHED (still allocated, to be
    freed or inserted by the caller): closing a row never frees KV by itself.
    """

    requests: tuple[RequestId, ...] = attrs.field(converter=request_ids)


# -- pages ------------------------------------------------------------------
@event("al")
@attrs.frozen
class Allocate(Event):
    """Take ``pages`` off the free list.

    With no ``items`` the pages are DETACHED (a bare allocator call).  Each
    item ``(request, slots)`` appends ``slots`` to that request's table at its
    current length; every page in ``pages`` must be the fresh page of exactly
    one item position, and continuing slots must extend the request's own
    partial last page.
    """

    pages: tuple[int, ...] = attrs.field(converter=ints)
    items: tuple[tuple[RequestId, tuple[int, ...]], ...] = attrs.field(
        default=(), converter=slot_items
    )


@event("ap")
@attrs.frozen
class Append(Event):
    """Commit written tokens: each item sets a request's committed length."""

    items: tuple[tuple[RequestId, int], ...] = attrs.field(converter=commit_items)


@event("as")
@attrs.frozen
class Assign(Event):
    """Write ``slots`` into a request's table at ``start`` (SGLang's row write).

    New pages must be DETACHED (they become the request's), tree pages
    (referenced, protected by locks), or pages the request already holds.
    """

    request: RequestId = attrs.field(converter=_request_id)
    start: int = attrs.field(converter=int)
    slots: tuple[int, ...] = attrs.field(converter=ints)


@event("tr")
@attrs.frozen
class Truncate(Event):
    """Shrink a request's table to ``length`` tokens; dropped own pages become DETACHED."""

    request: RequestId = attrs.field(converter=_request_id)
    length: int = attrs.field(converter=int)


@event("fr")
@attrs.frozen
class Free(Event):
    """Return DETACHED ``pages`` to the free list, at the head (in this order) or the tail."""

    pages: tuple[int, ...] = attrs.field(converter=ints)
    at_head: bool = attrs.field(default=False, converter=bool)


@event("sh")
@attrs.frozen
class Share(Event):
    """Map already-held ``slots`` into a request's table at ``start`` and add it as a holder.

    This is reference counting (vLLM's ``ref_cnt``, seed 002's shared prefix):
    each page gains the request as one more holder.  Pages must be held by
    the tree or by other requests, never free or DETACHED.
    """

    request: RequestId = attrs.field(converter=_request_id)
    start: int = attrs.field(converter=int)
    slots: tuple[int, ...] = attrs.field(converter=ints)


@event("cp")
@attrs.frozen
class Copy(Event):
    """Copy page contents ``src_pages[i] -> dst_pages[i]`` (copy-on-write; data plane).

    The state does not change; the event exists so an executor moves the
    bytes and a log shows the copy.  Sources must be held; destinations must
    be DETACHED (freshly allocated, not yet visible to anyone).
    """

    src_pages: tuple[int, ...] = attrs.field(converter=ints)
    dst_pages: tuple[int, ...] = attrs.field(converter=ints)


# -- radix tree -------------------------------------------------------------
@event("in")
@attrs.frozen
class Insert(Event):
    """Create leaf ``node`` under ``parent`` with ``key``/``slots``; ``owner``'s holds move to it."""

    parent: int = attrs.field(converter=int)
    key: tuple[int, ...] = attrs.field(converter=ints)
    slots: tuple[int, ...] = attrs.field(converter=ints)
    node: int = attrs.field(converter=int)
    time: int = attrs.field(converter=int)
    owner: RequestId = attrs.field(default=0, converter=_request_id)


@event("sp")
@attrs.frozen
class Split(Event):
    """Split ``node`` at token ``at``: ``new_node`` takes the top half, ``node`` keeps the rest."""

    node: int = attrs.field(converter=int)
    at: int = attrs.field(converter=int)
    new_node: int = attrs.field(converter=int)
    time: int = attrs.field(converter=int)


@event("to")
@attrs.frozen
class Touch(Event):
    """Stamp ``nodes`` with access ``time`` (the logical clock never goes back)."""

    nodes: tuple[int, ...] = attrs.field(converter=ints)
    time: int = attrs.field(converter=int)


@event("lk")
@attrs.frozen
class Lock(Event):
    """Increment ``lock_ref`` on ``node`` and every ancestor below the root."""

    node: int = attrs.field(converter=int)


@event("ul")
@attrs.frozen
class Unlock(Event):
    """Decrement ``lock_ref`` on ``node`` and every ancestor below the root."""

    node: int = attrs.field(converter=int)


@event("ev")
@attrs.frozen
class Evict(Event):
    """Remove unlocked leaves in order (a parent may follow its last child).

    Pages no one else holds return to the free list: per node, in node order,
    at the head (each node's pages become the new head) or the tail.
    """

    nodes: tuple[int, ...] = attrs.field(converter=ints)
    at_head: bool = attrs.field(default=False, converter=bool)


@event("rs")
@attrs.frozen
class Reset(Event):
    """Reset ``scope``: ``tree``, ``rows``, ``pages`` or ``all`` (see the reducer)."""

    scope: str = attrs.field(validator=attrs.validators.in_(("tree", "rows", "pages", "all")))


def encode_event(evt: Event) -> list[Any]:
    """``[tag, version, *fields]`` in plain msgpack types."""
    return [evt.TAG, evt.VERSION, *evt.to_fields()]


def decode_event(record: list[Any]) -> Event:
    """Inverse of :func:`encode_event` for current-version records.

    Raises ``ValueError`` (unknown tag, wrong version or field count/type).
    """
    if not isinstance(record, list) or len(record) < 2:
        raise ValueError("event record must be a list [tag, version, *fields]")
    tag, version = record[0], record[1]
    cls = EVENT_TYPES.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise ValueError(f"unknown event tag {tag!r}")
    if version != cls.VERSION:
        raise ValueError(f"{cls.__name__} version {version!r} is not {cls.VERSION}")
    try:
        return cls.from_fields(list(record[2:]))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad fields for {cls.__name__}: {exc}") from exc


# Block-pool (vLLM) events register themselves here so EVENT_TYPES is complete.
# Imported last: kvstate.events_block imports this module's names.
from kvstate import events_block as _events_block  # noqa: E402,F401
