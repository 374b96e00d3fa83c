"""Strict decoding of record bodies into events, checkpoints and end records.

Each event class gets a validator per field, derived once from the field's
attrs converter (``ints`` -> a tuple of ints, ``_request_id`` -> int or str,
...).  A field of the wrong type or a wrong field count is a
``LogFormatError`` at the record's offset; a valid record builds the event
directly from the (already immutable) decoded tuples, skipping the
converters, which is several times faster than the constructor.  Pure:
nothing here keeps state between calls except the schema tables built at
import time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from kvstate import events as ev
from kvstate.events import EVENT_TYPES, Event
from kvstate.log.format import (
    CHECKPOINT_TAG,
    END_TAG,
    FINGERPRINT_BYTES,
    Checkpoint,
    EndRecord,
    LogFormatError,
)
from kvstate.log.upcast import Registry, UpcastError, upcast

_INT = frozenset({int})
_RID = frozenset({int, str})
Validator = Callable[[Any], bool]


def _is_int(value: Any) -> bool:
    return type(value) is int


def _is_bool(value: Any) -> bool:
    return type(value) is bool


def _is_rid(value: Any) -> bool:
    return type(value) is int or type(value) is str


def _is_ints(value: Any) -> bool:
    return type(value) is tuple and (not value or set(map(type, value)) <= _INT)


def _is_rids(value: Any) -> bool:
    return type(value) is tuple and (not value or set(map(type, value)) <= _RID)


def _is_slot_items(value: Any) -> bool:
    if type(value) is not tuple:
        return False
    for item in value:
        if type(item) is not tuple or len(item) != 2 or not _is_rid(item[0]) or not _is_ints(item[1]):
            return False
    return True


def _is_commit_items(value: Any) -> bool:
    if type(value) is not tuple:
        return False
    for item in value:
        if type(item) is not tuple or len(item) != 2 or not _is_rid(item[0]) or type(item[1]) is not int:
            return False
    return True


_BY_CONVERTER: dict[Any, Validator] = {
    ev.ints: _is_ints,
    ev.request_ids: _is_rids,
    ev.slot_items: _is_slot_items,
    ev.commit_items: _is_commit_items,
    ev._request_id: _is_rid,  # noqa: SLF001 - the converter is the schema
    int: _is_int,
    bool: _is_bool,
}


@attrs.frozen
class _Schema:
    cls: type[Event]
    names: tuple[str, ...]
    validators: tuple[Validator | None, ...]  # None: use the class constructor for that field
    fast: bool  # every field has a validator and no attrs validator: build without converters


def _schema(cls: type[Event]) -> _Schema:
    names: list[str] = []
    validators: list[Validator | None] = []
    fast = True
    for field in attrs.fields(cls):  # type: ignore[arg-type]
        names.append(field.name)
        validator = _BY_CONVERTER.get(field.converter)
        if field.converter is None and field.type in ("str", str):
            validator = _is_str
        validators.append(validator)
        if validator is None or field.validator is not None:
            fast = False
    return _Schema(cls, tuple(names), tuple(validators), fast)


def _is_str(value: Any) -> bool:
    return type(value) is str


SCHEMAS: dict[str, _Schema] = {tag: _schema(cls) for tag, cls in EVENT_TYPES.items()}
_new = object.__new__
_set = object.__setattr__


def _compile(schema: _Schema) -> Callable[[tuple[Any, ...], int], Event]:
    """A decoder for one event type: check the field count and types, then build the event.

    Generated once per type so the hot loop has no per-field dispatch.
    """
    cls = schema.cls
    names = schema.names
    count = len(names)
    env: dict[str, Any] = {"_new": _new, "_set": _set, "cls": cls, "_bad": _bad_field,
                           "_count": _bad_count}
    lines = ["def decode(fields, offset):",
             f"    if len(fields) != {count}:",
             f"        _count(cls, {count}, fields, offset)",
             f"    ({''.join(f'f{i}, ' for i in range(count))}) = fields"]
    for i, (name, validator) in enumerate(zip(names, schema.validators, strict=True)):
        if validator is not None:
            env[f"v{i}"] = validator
            lines.append(f"    if not v{i}(f{i}):")
            lines.append(f"        _bad(cls, {name!r}, f{i}, offset)")
    if schema.fast:
        lines.append("    evt = _new(cls)")
        lines.extend(f"    _set(evt, {name!r}, f{i})" for i, name in enumerate(names))
        lines.append("    return evt")
    else:
        lines.append("    return _construct(cls, fields, offset)")
        env["_construct"] = _construct
    exec("\n".join(lines), env)  # noqa: S102 - generated from our own attrs schema
    return env["decode"]  # type: ignore[no-any-return]


def _bad_field(cls: type[Event], name: str, value: Any, offset: int) -> None:
    raise LogFormatError(offset, f"{cls.__name__}.{name} has a bad value of type {type(value).__name__}")


def _bad_count(cls: type[Event], count: int, fields: tuple[Any, ...], offset: int) -> None:
    raise LogFormatError(offset, f"{cls.__name__} has {count} fields, record has {len(fields)}")


def _construct(cls: type[Event], fields: tuple[Any, ...], offset: int) -> Event:
    try:
        return cls(*fields)
    except (TypeError, ValueError) as exc:
        raise LogFormatError(offset, f"bad fields for {cls.__name__}: {exc}") from None


DECODERS: dict[str, tuple[type[Event], Callable[[tuple[Any, ...], int], Event]]] = {
    tag: (schema.cls, _compile(schema)) for tag, schema in SCHEMAS.items()
}
# tag -> (current version, decoder): the reader's fast path for current-version records.
CURRENT: dict[str, tuple[int, Callable[[tuple[Any, ...], int], Event]]] = {
    tag: (cls.VERSION, decode) for tag, (cls, decode) in DECODERS.items()
}


def decode_record(raw: Any, offset: int, upcasters: Registry | None = None) -> Event | Checkpoint | EndRecord:
    """One decoded msgpack body to an event, a checkpoint or the end record."""
    if type(raw) is not tuple or len(raw) < 2:
        raise LogFormatError(offset, "record is not an array [tag, version, *fields]")
    tag = raw[0]
    entry = DECODERS.get(tag) if type(tag) is str else None
    if entry is None:
        if tag == CHECKPOINT_TAG or tag == END_TAG:
            return _framing_record(raw, offset)
        raise LogFormatError(offset, f"unknown record tag {tag!r}")
    cls, decode = entry
    version = raw[1]
    if version is cls.VERSION or version == cls.VERSION and type(version) is int:
        return decode(raw[2:], offset)
    if type(version) is not int:
        raise LogFormatError(offset, f"event {tag!r} version is a {type(version).__name__}")
    try:
        fields = upcast(tag, version, raw[2:], cls.VERSION, upcasters)
    except UpcastError as exc:
        raise LogFormatError(offset, str(exc)) from None
    return decode(fields, offset)


def _framing_record(raw: tuple[Any, ...], offset: int) -> Checkpoint | EndRecord:
    tag = raw[0]
    what = "checkpoint" if tag == CHECKPOINT_TAG else "end record"
    if len(raw) != 4 or raw[1] != 1:
        raise LogFormatError(offset, f"{what} must be [{tag!r}, 1, count, fingerprint]")
    count, fingerprint = raw[2], raw[3]
    if type(count) is not int or count < 0:
        raise LogFormatError(offset, f"{what} count {count!r} is not a non-negative int")
    if type(fingerprint) is not bytes or len(fingerprint) != FINGERPRINT_BYTES:
        raise LogFormatError(offset, f"{what} fingerprint is not {FINGERPRINT_BYTES} bytes")
    if tag == CHECKPOINT_TAG:
        return Checkpoint(count, fingerprint)
    return EndRecord(count, fingerprint)
