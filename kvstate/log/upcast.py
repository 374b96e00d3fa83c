"""Upcasters: bring an event record written by an older event version up to date.

An event class's ``VERSION`` bumps when one of its fields changes meaning or
shape.  Logs already written keep the old version in every record, so the
reader runs the record's fields through one registered function per step::

    (tag, v) --upcaster--> fields at v + 1 --upcaster--> ... --> fields at VERSION

Register a step with :func:`upcaster`; a missing step makes the record
undecodable (``LogFormatError`` naming the tag and version).  Every released
log format must keep decoding: ``tests/test_replay_corpus.py`` replays the
committed logs under ``replay/`` (the golden corpus) on every change.

Format version 1 is the first release, so the shipped registry is empty.  A
registry is a plain dict owned by its creator; :data:`UPCASTERS` is the one
the reader uses by default and is only changed at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Fields = tuple[Any, ...]
Upcaster = Callable[[Fields], Fields]
Registry = dict[tuple[str, int], Upcaster]

UPCASTERS: Registry = {}


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


class UpcastError(ValueError):
    """No path from a record's version to the current one (or an upcaster refused it)."""


def upcast(tag: str, version: int, fields: Fields, current: int,
           registry: Registry | None = None) -> Fields:
    """Fields of ``tag`` at ``current`` from a record at ``version`` (pure; may raise ``UpcastError``)."""
    steps = UPCASTERS if registry is None else registry
    if version > current:
        raise UpcastError(f"event {tag!r} version {version} is newer than this kvstate ({current})")
    while version < current:
        step = steps.get((tag, version))
        if step is None:
            raise UpcastError(f"no upcaster from event {tag!r} version {version}")
        try:
            fields = tuple(step(fields))
        except (TypeError, ValueError, IndexError, KeyError) as exc:
            raise UpcastError(f"upcaster for {tag!r} version {version} failed: {exc}") from None
        version += 1
    return fields
