"""Events of the Mamba state pool of a FULL + MAMBA hybrid cache (SGLang 0.5.23).

A Mamba layer keeps one fixed-size recurrent state per sequence, not one KV
entry per token, so its pool hands out *slots* (``kvstate.state.MambaTier``):
a request row holds its running state (``mamba_pool_idx``) and, with the
extra buffer, its ping-pong track slots; a tree node may hold the state
reached at its end.  Each change of owner is its own fact; the rules live
in ``kvstate.rules.mamba``.  Every time is a logical time (``State.clock``).
"""

from __future__ import annotations

from kvstate.events.base import Event, Id, RequestId, event


@event
class MambaAlloc(Event, tag="ma", frozen=True):
    """Take ``slots`` off the Mamba free list (wherever they sit); they are held DETACHED
    until a row binds them (``MambaBind``) or a tree node takes one (``MambaCommit``)."""

    slots: tuple[Id, ...]


@event
class MambaBind(Event, tag="mb", frozen=True):
    """Open row ``row`` (with no Mamba slots yet) holds DETACHED ``slots``: its running
    state ``slots[0]`` and its ping-pong track slots after it (0: an empty entry)."""

    row: RequestId
    slots: tuple[Id, ...]


@event
class MambaFree(Event, tag="mf", frozen=True):
    """Return held ``slots`` (DETACHED or a row's entries, which become empty) to the tail
    of the Mamba free list, in this order; a row left with no entry holds no slots."""

    slots: tuple[Id, ...]


@event
class MambaDonate(Event, tag="md", frozen=True):
    """Row ``row``'s entry ``index`` (a ping-pong track slot holding a checkpoint) leaves the
    row DETACHED, to be inserted; the DETACHED slot ``fresh`` takes its place."""

    row: RequestId
    index: Id
    fresh: Id


@event
class MambaCopy(Event, tag="mx", frozen=True):
    """The state in slot ``src`` (a tree state or a held slot) is copied into the held slot
    ``dst`` (copy-on-match, or an unfinished checkpoint's fork).  Owners do not change."""

    src: Id
    dst: Id


@event
class MambaCommit(Event, tag="mc", frozen=True):
    """Tree node ``node`` (with no state) takes held slot ``slot`` as the state at its end,
    entering the Mamba LRU as its most recent entry at ``time``."""

    node: Id
    slot: Id
    time: Id


@event
class MambaTouch(Event, tag="mt", frozen=True):
    """Move ``node``'s state to the most recent end of the Mamba LRU at ``time``."""

    node: Id
    time: Id


@event
class MambaLock(Event, tag="ml", frozen=True):
    """One more Mamba lock on ``node`` itself, which holds a state (the one a request
    resumes from); the node's FULL locks must exceed its Mamba locks (lock FULL first)."""

    node: Id


@event
class MambaUnlock(Event, tag="mu", frozen=True):
    """One Mamba lock less on ``node``."""

    node: Id


@event
class MambaEvict(Event, tag="me", frozen=True):
    """Drop the states of Mamba-unlocked ``nodes``, in order: each slot goes to the tail of
    the free list; the nodes keep their FULL KV (a leaf that goes entirely is dropped here
    and then removed by ``Evict``)."""

    nodes: tuple[Id, ...]


MAMBA_EVENTS = (MambaAlloc, MambaBind, MambaFree, MambaDonate, MambaCopy, MambaCommit,
                MambaTouch, MambaLock, MambaUnlock, MambaEvict)


def _refresh_codec() -> None:
    # The codec's union is built over the event types known when it was imported; these
    # register later, so it is rebuilt once to cover them (kvstate.events.codec).
    from kvstate.events.codec import CODEC

    if MambaAlloc.TAG not in CODEC.types:
        CODEC.refresh()


_refresh_codec()
