"""What every event shares: the base class, the field types and the tag registry.

An event records an outcome (which pages, which rows, which node id, which
time) so replaying it never consults policy.  Events are immutable msgspec
``Struct``s; each encodes to plain msgpack as ``[tag, version, *fields]`` in
declaration order (``kvstate.events.codec``).  The tag is a stable
two-letter code; ``VERSION`` bumps when a field changes meaning.

The field types carry their ranges, so decoding a log validates in C as it
goes: ids, slots, times and token ids are ints in ``0..2**63-1`` (int64, the
dtype SGLang and vLLM index with); request names are strings of at most
``MAX_NAME_CHARS`` characters.  A bool or a float is never an int.
Events hold only ints, strings and tuples of them, so they can never be
part of a reference cycle: they are structs the cyclic collector does not
track (``gc=False``), which keeps young collections rare while an engine's
journal holds thousands of them.
Constructing an event in Python does not validate (the planner builds
millions of them); ``kvstate.events.codec.validated`` does, and the public
``apply`` entry points call it.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, TypeVar

import msgspec

MAX_ID = (1 << 63) - 1
MAX_NAME_CHARS = 4096

Id = Annotated[int, msgspec.Meta(ge=0, le=MAX_ID)]  # pages, slots, rows, nodes, times, lengths
Token = Annotated[int, msgspec.Meta(ge=0, le=MAX_ID)]  # token ids
Signed = Annotated[int, msgspec.Meta(ge=-MAX_ID - 1, le=MAX_ID)]
Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME_CHARS)]
RequestId = Id | Name  # a request row (SGLang) or a request name (vLLM, seed 002)

E = TypeVar("E", bound="Event")

EVENT_TYPES: dict[str, type[Event]] = {}


class Event(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True, gc=False):
    """Base of all events.  Subclasses pass ``tag=`` and are registered with :func:`event`."""

    TAG: ClassVar[str]
    VERSION: ClassVar[int] = 1

    def fields(self) -> tuple[Any, ...]:
        """Field values in declaration order."""
        return tuple(getattr(self, name) for name in self.__struct_fields__)


def event(cls: type[E]) -> type[E]:
    """Register an event class under its struct tag (which must be unique)."""
    tag = cls.__struct_config__.tag
    if not isinstance(tag, str) or len(tag) != 2 or tag.startswith("#"):
        raise ValueError(f"{cls.__name__} needs a two-letter tag not starting with '#'")
    if tag in EVENT_TYPES:
        raise ValueError(f"event tag {tag!r} already used by {EVENT_TYPES[tag].__name__}")
    cls.TAG = tag
    EVENT_TYPES[tag] = cls
    return cls
