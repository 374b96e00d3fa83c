"""Event records: ``[tag, version, *fields]`` as msgpack bytes, validated in C.

msgspec encodes an event as ``[tag, *fields]`` (an array-like tagged struct);
a record also carries the event's version after the tag.  Both directions
therefore patch two bytes of msgspec's output instead of building Python
lists: the array header grows or shrinks by one and the version byte is
inserted or checked.  Records that do not have that exact shape (another
encoder's wider headers, an older version) take the slow path: a generic,
size-limited decode, the registered upcasters, then the same validation.

Decoding checks every field's type and range (``kvstate.events.base``) and
raises ``EventDecodeError`` for anything else: an unknown tag, a bool where
an int belongs, a float, an out-of-range id, a wrong field count, trailing
bytes, absurd nesting.  Pure; the encoder and decoder are built once.

A list of events can also go as one msgpack array of plain ``[tag, *fields]``
items (``encode_plain_list`` / ``decode_plain_list``) whose versions the
caller knows from elsewhere (a log's header): one C call encodes or decodes
and validates the whole list, instead of a Python call per event.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Union

import msgpack
import msgspec

from kvstate.events.base import EVENT_TYPES, Event
from kvstate.msgpack_raw import RAW_ITEMS, array_count, array_header, raw_kind, raw_scalar, shown

Fields = tuple[Any, ...]
Upcaster = Callable[[Fields], Fields]
Registry = dict[tuple[str, int], Upcaster]

UPCASTERS: Registry = {}  # (tag, from_version) -> fields at from_version + 1
_MISSING = object()


class EventDecodeError(ValueError):
    """A record body is not a valid event of any known tag and version."""


def upcaster(tag: str, from_version: int,
             registry: Registry | None = None) -> Callable[[Upcaster], Upcaster]:
    """Register ``fn(fields) -> fields`` turning version ``from_version`` of ``tag`` into the next."""
    target = UPCASTERS if registry is None else registry

    def register(fn: Upcaster) -> Upcaster:
        key = (tag, from_version)
        if key in target:
            raise ValueError(f"an upcaster for {tag!r} version {from_version} is already registered")
        target[key] = fn
        return fn

    return register


def _upcast_path(tag: str, version: int, current: int, registry: Registry) -> None:
    """Refuse a version no upcaster chain leads from (before any field is decoded)."""
    if version > current:
        raise EventDecodeError(f"event {tag!r} version {version} is newer than this kvstate "
                               f"({current})")
    for step in range(version, current):
        if (tag, step) not in registry:
            raise EventDecodeError(f"no upcaster from event {tag!r} version {step}")


def _upcast(tag: str, version: int, fields: Fields, current: int, registry: Registry) -> Fields:
    _upcast_path(tag, version, current, registry)
    while version < current:
        step = registry.get((tag, version))
        if step is None:
            raise EventDecodeError(f"no upcaster from event {tag!r} version {version}")
        try:
            fields = tuple(step(fields))
        except (TypeError, ValueError, IndexError, KeyError) as exc:
            raise EventDecodeError(f"upcaster for {tag!r} version {version} failed: {exc}") from None
        version += 1
    return fields


class Codec:
    """Encoder and validating decoder over every registered event type.

    Built once per set of event types.  An event module imported after the
    codec (the package imports its modules in any order) registers more
    types; the codec notices on the first encode or decode that misses and
    rebuilds (``refresh``), so the hot path pays nothing for it.
    """

    def __init__(self) -> None:
        self._from_record: dict[bytes, bytes] = {}
        self._record_prefix: dict[type, bytes] = {}  # event class -> its records' first bytes
        self.refresh()

    def stale(self) -> bool:
        """True when event types were registered after the last ``refresh``."""
        return len(EVENT_TYPES) != len(self.types)

    def refresh(self) -> None:
        types = tuple(EVENT_TYPES.values())
        self.types = dict(EVENT_TYPES)
        self._encoder = msgspec.msgpack.Encoder()
        self._encode = self._encoder.encode
        self._decoder = msgspec.msgpack.Decoder(Union[types])  # type: ignore[valid-type]  # noqa: UP007
        self._list_decoder = msgspec.msgpack.Decoder(list[Union[types]])  # type: ignore[valid-type]  # noqa: UP007
        self._list_decoders: dict[tuple[tuple[str, int], ...], Any] = {}  # per header's versions
        self.versions = {cls.TAG: cls.VERSION for cls in types}
        # msgspec writes a fixarray header and a two-byte fixstr tag; a record has the
        # version after the tag.  ``_record_prefix`` gives each class its record's first 5
        # bytes (for msgspec's 4), ``_from_record`` maps them back.  Only the exact field
        # count maps back: msgspec would accept an array_like struct with trailing defaults
        # left out, and a record must carry every field.  The maps are updated in place, so
        # a reader that bound them sees new types too.
        self._from_record.clear()
        self._record_prefix.clear()
        for cls in types:
            tag = b"\xa2" + cls.TAG.encode()
            count = len(cls.__struct_fields__) + 1  # the tag, then the fields
            if count + 1 > 15:  # the prefixes assume a one-byte (fixarray) header
                raise ValueError(f"{cls.__name__} has {count - 1} fields; an event has at most 13")
            plain = bytes((0x90 | count,)) + tag
            record = bytes((0x90 | (count + 1),)) + tag + bytes((cls.VERSION,))
            self._from_record[record] = plain
            # msgspec leaves out no field when encoding, so one prefix per class suffices.
            self._record_prefix[cls] = record

    # -- encoding ----------------------------------------------------------------
    def encode(self, evt: Event) -> bytes:
        """The record body ``[tag, version, *fields]`` (msgpack)."""
        prefix = self._record_prefix.get(type(evt))
        if prefix is None:
            if not self.stale():
                raise EventDecodeError(f"{type(evt).__name__} is not a registered event type")
            self.refresh()
            return self.encode(evt)
        # msgspec begins every encoding of the class with the 4 bytes ``prefix`` replaces
        return prefix + self._encode(evt)[4:]

    def encode_plain_list(self, events: list[Event], out: bytearray) -> None:
        """Append ``[[tag, *fields], ...]`` for ``events`` to ``out`` (versions left out)."""
        if self.stale():
            self.refresh()
        self._encoder.encode_into(events, out, -1)

    # -- decoding ----------------------------------------------------------------
    def decode_plain_list(self, body: bytes | memoryview, versions: dict[str, int],
                          upcasters: Registry | None = None) -> list[Event]:
        """The validated events of ``encode_plain_list``'s array, written with ``versions``
        (tag -> version, e.g. a log header's ``event_versions``).

        One typed decode validates the whole list in C, over the event types whose version
        ``versions`` gives as this codec's; the result is accepted only when it encodes back
        to exactly ``body`` (msgspec would fill a trailing field left out with its default,
        which a record must not do).  Anything else (an item of an older version, another
        encoder's wider headers, any error) takes the path of single records item by item:
        upcasters, and an error that names the item and the field.
        """
        if self.stale():
            self.refresh()
        decoder = self._list_decoder if versions == self.versions else \
            self._decoder_for(versions)
        if decoder is not None:
            try:
                events: list[Event] = decoder.decode(body)
            except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
                pass  # named precisely below
            else:
                if self._encoder.encode(events) == body:
                    return events
        try:
            items = RAW_ITEMS.decode(body)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise EventDecodeError(f"event list is not a msgpack array ({exc})") from None
        events = []
        for index, item in enumerate(items):
            try:
                events.append(self.decode(self._record_of(bytes(item), versions), upcasters))
            except EventDecodeError as exc:
                raise EventDecodeError(f"item {index}: {exc}") from None
        return events

    def _decoder_for(self, versions: dict[str, int]) -> Any:
        """A list decoder over the event types at the version ``versions`` gives (None: no
        type is), cached per distinct map (a log's header has one)."""
        key = tuple(sorted((tag, version) for tag, version in versions.items()
                           if type(tag) is str and type(version) is int))
        cached = self._list_decoders.get(key, _MISSING)
        if cached is _MISSING:
            types = tuple(cls for cls in self.types.values() if versions.get(cls.TAG) == cls.VERSION
                          and type(versions.get(cls.TAG)) is int)
            cached = msgspec.msgpack.Decoder(list[Union[types]]) if types else None  # type: ignore[valid-type]  # noqa: UP007
            if len(self._list_decoders) >= 16:  # bounded, whatever many headers are read
                self._list_decoders.clear()
            self._list_decoders[key] = cached
        return cached

    def _record_of(self, item: bytes, versions: dict[str, int]) -> bytes:
        """``[tag, *fields]`` made ``[tag, version, *fields]`` with the tag's version in
        ``versions``."""
        parts = _raw_items(item, "item", "[tag, *fields]", 1)
        tag = raw_scalar(parts[0], str)
        if type(tag) is not str:
            raise EventDecodeError(f"item tag is {shown(parts[0])}")
        version = versions.get(tag)
        if type(version) is not int or not 0 <= version < 1 << 16:
            raise EventDecodeError(f"the header gives no version for event tag {tag!r}")
        return b"".join((array_header(len(parts) + 1), bytes(parts[0]),
                         msgspec.msgpack.encode(version), *(bytes(part) for part in parts[1:])))

    def decode(self, body: bytes, upcasters: Registry | None = None) -> Event:
        """A validated event from a record body; ``EventDecodeError`` for anything else."""
        plain = self._from_record.get(body[:5])
        if plain is not None:
            return self._typed(b"".join((plain, memoryview(body)[5:])), body[2:4])
        return self._decode_slow(body, UPCASTERS if upcasters is None else upcasters)

    def _typed(self, plain: bytes, tag: bytes) -> Event:
        """Decode ``[tag, *fields]`` straight into the event struct (checked in C as it goes)."""
        try:
            return self._decoder.decode(plain)  # type: ignore[no-any-return]
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise EventDecodeError(_explain(tag, exc)) from None
        except RecursionError:  # defensive: typed decoding fails at the first wrong level
            raise EventDecodeError("record nests deeper than any event field") from None

    def _decode_slow(self, body: bytes, registry: Registry) -> Event:
        """A record the fast path did not recognise: another encoder's wider headers, an
        older version, a wrong field count or not an event at all.

        Never decodes a body generically (a 16 MiB record of empty containers would
        become a gigabyte of Python objects): the array header is read by hand, the
        elements are split as raw msgpack, only the tag and version are decoded
        alone, and the fields go through the same typed decoder as the fast path.
        Only a registered upcaster chain decodes old fields generically.
        """
        items = _raw_items(body, "record", "[tag, version, *fields]", 2)
        tag = raw_scalar(items[0], str)
        cls = self.types.get(tag) if type(tag) is str else None
        if cls is None and self.stale():
            self.refresh()
            return self.decode(body, registry)
        if cls is None:
            raise EventDecodeError(f"unknown record tag {shown(items[0])}")
        version = raw_scalar(items[1], int)
        if type(version) is not int:
            raise EventDecodeError(f"event {tag!r} version is a {raw_kind(items[1])}")
        fields = items[2:]
        if version != cls.VERSION:
            _upcast_path(tag, version, cls.VERSION, registry)  # refuse before decoding anything
            decoded = tuple(_generic(raw) for raw in fields)
            return self.from_fields(cls, _upcast(tag, version, decoded, cls.VERSION, registry))
        expected = len(cls.__struct_fields__)
        if len(fields) != expected:
            raise EventDecodeError(f"{cls.__name__} has {expected} fields, record has {len(fields)}")
        plain = bytes((0x90 | (expected + 1),)) + bytes(items[0]) + b"".join(bytes(f) for f in fields)
        return self._typed(plain, cls.TAG.encode())

    def from_fields(self, cls: type[Event], fields: Fields) -> Event:
        """Validate plain field values (lists or tuples) into an event of ``cls``."""
        expected = len(cls.__struct_fields__)
        if len(fields) != expected:
            raise EventDecodeError(f"{cls.__name__} has {expected} fields, record has {len(fields)}")
        try:
            return msgspec.convert([cls.TAG, *fields], cls, strict=True)
        except (msgspec.ValidationError, TypeError, RecursionError) as exc:
            raise EventDecodeError(f"bad fields for {cls.__name__}: {_where(cls, exc)}") from None


# A record is [tag, version, *fields]; no event has more than a handful of fields, so a
# longer top-level array is refused from its header alone.
MAX_RECORD_ITEMS = 2 + 16
_PATH = re.compile(r"^(?P<what>.*?)(?: - at `\$\[(?P<index>\d+)\](?P<rest>[^`]*)`)?$", re.S)


def _raw_items(body: bytes, what: str, shape: str, leading: int) -> list[msgspec.Raw]:
    """The top-level elements of ``body`` as raw msgpack, for an array of ``leading`` items
    (tag, maybe version) before the fields; the size is checked from the array header
    before anything is decoded."""
    count = array_count(body)
    if count is None or count < leading:
        raise EventDecodeError(f"{what} is not an array {shape}")
    if count - leading + 2 > MAX_RECORD_ITEMS:
        raise EventDecodeError(f"{what} has {count - leading} fields, more than any event has")
    try:
        return RAW_ITEMS.decode(body)  # type: ignore[no-any-return]
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise EventDecodeError(f"{what} body is not valid msgpack ({exc})") from None


def _generic(raw: msgspec.Raw) -> Any:
    """An old-version field decoded without a type (only on a registered upcaster path)."""
    try:
        return msgpack.unpackb(bytes(raw), use_list=True, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError,
            RecursionError) as exc:
        raise EventDecodeError(f"record field is not valid msgpack ({exc})") from None


def _where(cls: type[Event], exc: Exception) -> str:
    """msgspec's message with its ``$[k]...`` path named as ``Class.field[...]``."""
    match = _PATH.match(str(exc))
    if match is None or match.group("index") is None:
        return str(exc)
    index = int(match.group("index")) - 1  # $[0] is the tag in [tag, *fields]
    names = cls.__struct_fields__
    field = names[index] if 0 <= index < len(names) else f"#{index}"
    rest = match.group("rest")
    at = f" at {rest}" if rest else ""
    return f"{cls.__name__}.{field} has a bad value{at}: {match.group('what')}"


def _explain(tag: bytes, exc: Exception) -> str:
    cls = EVENT_TYPES.get(tag.decode(errors="replace"))
    if cls is None:
        return f"bad record {tag!r}: {exc}"
    return f"bad fields for {cls.__name__}: {_where(cls, exc)}"


CODEC = Codec()


def encode_event(evt: Event) -> bytes:
    """The msgpack record body of ``evt``: ``[tag, version, *fields]``."""
    return CODEC.encode(evt)


def decode_event(body: bytes) -> Event:
    """The validated event of a record body (``EventDecodeError`` if it is not one)."""
    return CODEC.decode(body)


def event_record(evt: Event) -> list[Any]:
    """``[tag, version, *fields]`` as plain Python lists and values (for display and tests)."""
    return msgpack.unpackb(CODEC.encode(evt), use_list=True)  # type: ignore[no-any-return]


def validated(evt: Event) -> Event:
    """``evt`` with every field checked and normalised (tuples, exact ints); raises
    ``EventDecodeError`` when a field has the wrong type or range.  About a
    microsecond: the public ``apply`` entry points call it, planners do not."""
    cls = type(evt)
    if EVENT_TYPES.get(getattr(cls, "TAG", "")) is not cls:
        raise EventDecodeError(f"{cls.__name__} is not a registered event type")
    return CODEC.from_fields(cls, evt.fields())
