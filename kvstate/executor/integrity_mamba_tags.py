"""Tags of Mamba states: where they live in a ``MambaStatePool`` and how one is computed fast.

A state slot is a row of every state tensor (each conv state and the SSM
state, ``[layers, slots + 1, ...]``); its tag is the one
:func:`~kvstate.executor.integrity_tags.tag_array` derives from ``(writer,
position)`` for each (tensor, layer) plane, the planes numbered apart from
the KV layers' (``PLANE_BASE``).  :class:`StateTags` computes every tensor's
tags at the widest row's width (a narrower row keeps the first columns), so
one computation serves a slot's whole state, and :func:`tag_row` computes one
state's in Python integers: a running request writes one state per step, and
at that size numpy's per-call overhead is the cost.  Pure but for
``StateTags.write``, which mutates the pool's tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np

from kvstate.executor.integrity_tags import (
    _K1,  # tag_array's multipliers, for tag_row
    _K2,
    _K3,
    _K4,
    Content,
    TagLayout,
    tag_array,
)

PLANE_BASE = 1 << 16  # Mamba tag planes are numbered apart from the KV layers'


_MASK = (1 << 64) - 1
_U1, _U2, _U3, _U4 = (k & _MASK for k in (_K1, _K2, _K3, _K4))  # as unsigned 64-bit words


def tag_row(uid: int, position: int, consts: Sequence[int], width: int) -> np.ndarray:
    """``tag_array`` of one ``(uid, position)`` in Python integers: ``[planes, 1, width]`` tag
    bytes, bit for bit the same (unsigned arithmetic modulo 2**64 is int64's wrapping, and the
    masked shifts are logical either way), at a third of its cost for one token."""
    base = (uid * _U1 + position * _U2) & _MASK
    words = -(-width // 8)
    out = bytearray()
    for const in consts:
        h = (base + const) & _MASK
        h ^= (h >> 31) & 0x1FFFFFFFF
        h = (h * _U3) & _MASK
        h ^= (h >> 29) & 0x7FFFFFFFF
        if words == 1:
            out += h.to_bytes(8, "little")
            continue
        for word in range(words):
            x = ((h ^ ((word * _U4) & _MASK)) * _U2) & _MASK
            x ^= (x >> 32) & 0xFFFFFFFF
            out += x.to_bytes(8, "little")
    tags = np.frombuffer(bytes(out), dtype=np.uint8).reshape(len(consts), 1, words * 8)
    return tags[:, :, :width] if words * 8 != width else tags


class StateTags(TagLayout):
    """The tag layout of a ``MambaStatePool`` (a row is a slot).  Every state tensor's tags
    are computed at the widest row's width (a narrower row keeps the first columns), so one
    computation serves them all: at one slot per write the number of vector operations is
    the cost."""

    def __init__(self, tensors: Sequence[Any], planes: Sequence[Sequence[tuple[int, int]]]
                 ) -> None:
        super().__init__(tensors, planes, 1)
        self.tag_width = max(group.width for group in self.groups)
        for group in self.groups:
            group.tag_width = self.tag_width
        self.consts = np.concatenate([group.consts for group in self.groups])
        self.const_ints = [int(c) & _MASK for c in self.consts]
        self.planes = sum(len(group.planes) for group in self.groups)

    def write(self, slots: Sequence[int], contents: Sequence[Content]) -> None:
        if not len(slots):
            return
        if len(slots) * self.tag_width * self.planes > 1 << 20:  # a large batch: plane-wise
            super().write(slots, contents)
            return
        if len(contents) == 1:  # a forward step's one state: the cheap path
            tags = tag_row(contents[0][0], contents[0][1], self.const_ints, self.tag_width)
        else:
            pairs = np.fromiter(chain.from_iterable(contents), dtype=np.int64,
                                count=2 * len(contents)).reshape(-1, 2)
            tags = tag_array(pairs[:, 0], pairs[:, 1], self.consts, self.tag_width)
        index = np.asarray(slots, dtype=np.int64)
        first = 0
        for group in self.groups:
            count = len(group.planes)
            group.write(index, group.lut[tags[first:first + count, :, :group.width]])
            first += count


def mamba_layout(pool: Any) -> StateTags:
    """Tag planes of a ``MambaStatePool``: one per (state tensor, layer); a row is a slot."""
    return StateTags(list(pool.tensors),
                     [[(PLANE_BASE + 8 * layer + number, 2) for layer in range(pool.layer_num)]
                      for number in range(len(pool.tensors))])


__all__ = ["PLANE_BASE", "StateTags", "mamba_layout", "tag_row"]
