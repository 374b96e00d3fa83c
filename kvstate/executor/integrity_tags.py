"""Integrity tags: the deterministic K/V pattern a computed token holds in integrity mode.

A tag is a row of small integers in ``[-128, 127]`` (exact in fp16/bf16/fp32)
derived from ``(writer uid, position, layer, salt)`` (salt 0 for K or the MLA
latent row, 1 for V).  A ``Content`` names the ``(writer uid, position the
KV was computed for)`` whose tag a slot should hold; two special uids stand
for rows that hold no tag: ``NULL_UID`` (block mode's null page: whatever
the padding row ``position`` holds) and ``POISON_UID`` (a freed slot: the
NaN the executor poisons it with).

Tags are computed with numpy (a handful of vector ops, cheaper than torch's
per-call overhead at replay sizes) and read and written as integer words
(the buffers' bit patterns), so a comparison is exact, NaN included.

Ownership: nothing here keeps state of its own.  ``tag_values`` and
``tag_array`` are pure; a :class:`TagLayout` holds views of its caller's
tensors (the executor's page tensors, or a host pool's) and mutates them
only in :meth:`TagLayout.write`.  Which slot should hold which content is
the business of :class:`~kvstate.executor.integrity.IntegrityMonitor`.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np
import torch

__all__ = ["NULL_UID", "POISON_UID", "Content", "TagLayout", "tag_array", "tag_values"]

Content = tuple[int, int]  # (writer uid, position the KV was computed for)
NULL_UID = -1  # (NULL_UID, row): reads padding row ``row`` as it is (block-mode null page)
POISON_UID = -2  # (POISON_UID, 0): a freed slot, poisoned with NaN

_M1, _M2, _M3, _M4 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0xD6E8FEB86659FD93
_WORDS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_CHUNK = 1 << 22  # tag bytes computed at once (a large prefill goes plane by plane)


def _wrap(value: int) -> int:
    """``value`` as a two's-complement int64 (what numpy's int64 arithmetic wraps to)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >> 63 else value


_K1, _K2, _K3, _K4 = (_wrap(m) for m in (_M1, _M2, _M3, _M4))


def plane_const(layer: int, salt: int) -> int:
    """What one plane (a layer's K, V or latent rows) adds to a token's hash."""
    return _wrap((layer * 4 + salt + 1) * _M3)


def tag_array(uids: np.ndarray, positions: np.ndarray, consts: np.ndarray, width: int) -> np.ndarray:
    """``[planes, n, width]`` tag bytes in ``[0, 255]`` (the tag is the byte - 128; pure).

    One 64-bit hash per (token, plane), mixed like SplitMix64's finalizer,
    then one more mix per 8 columns; the bytes of the mixed words are the
    tag.  ``consts`` holds one :func:`plane_const` per plane.  Few vector
    operations, because at replay sizes their count is the cost.
    """
    h = uids.astype(np.int64) * _K1 + positions.astype(np.int64) * _K2
    h = h[None, :] + consts[:, None]
    h ^= (h >> 31) & 0x1FFFFFFFF  # logical shifts: the sign bit must not smear
    h *= _K3
    h ^= (h >> 29) & 0x7FFFFFFFF
    words = -(-width // 8)
    if words > 1:
        x = h[:, :, None] ^ (np.arange(words, dtype=np.int64) * _K4)
        x *= _K2
        x ^= (x >> 32) & 0xFFFFFFFF
    else:
        x = h[:, :, None]
    tags = x.view(np.uint8).reshape(h.shape[0], h.shape[1], words * 8)
    return tags[:, :, :width] if words * 8 != width else tags


def tag_values(uids: torch.Tensor, positions: torch.Tensor, layer: int, width: int,
               salt: int) -> torch.Tensor:
    """``[n, width]`` int64 tags in ``[-128, 127]`` for ``(uid, position)`` pairs (pure)."""
    consts = np.array([plane_const(layer, salt)], dtype=np.int64)
    tags = tag_array(uids.cpu().numpy(), positions.cpu().numpy(), consts, width)[0]
    return (torch.from_numpy(tags.astype(np.int64)) - 128).to(uids.device)


def _pairs(contents: Sequence[Content]) -> np.ndarray:
    """``contents`` as an ``[n, 2]`` int64 array (``fromiter``: far cheaper than ``asarray``)."""
    flat = np.fromiter(chain.from_iterable(contents), dtype=np.int64, count=2 * len(contents))
    return flat.reshape(-1, 2)


_PATTERNS: dict[torch.dtype, tuple[np.ndarray, Any]] = {}


def _patterns(dtype: torch.dtype) -> tuple[np.ndarray, Any]:
    """``(tag byte -> bit pattern table, poison bit pattern)`` of ``dtype`` (cached, read-only)."""
    cached = _PATTERNS.get(dtype)
    if cached is None:
        words = _WORDS[torch.empty((), dtype=dtype).element_size()]
        lut = torch.arange(-128, 128, dtype=torch.int64).to(dtype).view(words).numpy().copy()
        lut.flags.writeable = False
        # The NaN ``index_fill_`` writes, as the executor poisons freed slots.
        nan = torch.zeros(1, dtype=dtype).index_fill_(0, torch.tensor([0]), float("nan"))
        cached = _PATTERNS[dtype] = (lut, nan.view(words).numpy()[0])
    return cached


class _Group:
    """One ``[planes, rows, ...]`` tensor seen as integer words ``[planes, rows, width]``."""

    def __init__(self, tensor: torch.Tensor, planes: Sequence[tuple[int, int]]) -> None:
        if not tensor.is_contiguous() or tensor.shape[0] != len(planes):
            raise ValueError("a tag group needs a contiguous [planes, rows, ...] tensor")
        words = _WORDS[tensor.element_size()]
        self.words = tensor.view(words).reshape(tensor.shape[0], tensor.shape[1], -1)
        self.width = self.words.shape[2]
        self.tag_width = self.width  # columns the tags are computed at (a prefix is used)
        self.planes = tuple(planes)
        self.consts = np.array([plane_const(layer, salt) for layer, salt in planes], dtype=np.int64)
        self.device = tensor.device
        # On the CPU the buffers are read and written through numpy views of the same memory.
        self.array = self.words.numpy() if tensor.device.type == "cpu" else None
        self.lut, self.poison = _patterns(tensor.dtype)

    def unpoisoned_pages(self, pages: list[int], size: int) -> np.ndarray:
        """Which of ``pages`` hold anything but the poison (a bool per page)."""
        if self.array is not None:
            got = self.array.reshape(self.array.shape[0], -1, size * self.width)[:, pages, :]
        else:
            flat = self.words.view(self.words.shape[0], -1, size * self.width)
            got = flat.index_select(1, torch.tensor(pages, device=self.device)).cpu().numpy()
        return (got != self.poison).any(axis=(0, 2))  # type: ignore[no-any-return]

    def read(self, slots: np.ndarray) -> np.ndarray:
        if self.array is not None:
            return self.array[:, slots, :]
        index = torch.from_numpy(slots).to(self.device)
        return self.words.index_select(1, index).cpu().numpy()

    def write(self, slots: np.ndarray, words: np.ndarray, planes: slice = slice(None)) -> None:
        if self.array is not None:
            self.array[planes, slots, :] = words
            return
        index = torch.from_numpy(slots).to(self.device)
        self.words[planes].index_copy_(1, index, torch.from_numpy(words).to(self.device))

    def expected(self, uids: np.ndarray, positions: np.ndarray, planes: slice = slice(None)
                 ) -> np.ndarray:
        tags = tag_array(uids, positions, self.consts[planes], self.tag_width)
        return self.lut[tags if self.tag_width == self.width else tags[:, :, :self.width]]

    def chunks(self, rows: int) -> list[slice]:
        """Plane slices small enough to compute ``rows`` rows of tags at once."""
        per_plane = max(1, rows * self.width)
        step = max(1, _CHUNK // per_plane)
        return [slice(i, i + step) for i in range(0, len(self.planes), step)]


class TagLayout:
    """Where the tags of one set of buffers live: groups of planes, each a (layer, salt).

    Owns views of the caller's tensors only; ``write`` mutates them.
    """

    def __init__(self, tensors: Sequence[torch.Tensor],
                 planes: Sequence[Sequence[tuple[int, int]]], page_size: int) -> None:
        self.page_size = page_size
        self.groups = [_Group(t, p) for t, p in zip(tensors, planes, strict=True)]
        self.where = {plane: (g, i) for g, group in enumerate(self.groups)
                      for i, plane in enumerate(group.planes)}

    @classmethod
    def of_executor(cls, executor: Any, tensors: Sequence[torch.Tensor] | None = None) -> TagLayout:
        """The layout of ``executor``'s page tensors (or of ``tensors`` shaped like them)."""
        from kvstate.executor.mla import MLATorchExecutor

        tensors = list(executor.page_views.tensors if tensors is None else tensors)
        layers = range(executor.layer_num)
        if isinstance(executor, MLATorchExecutor):  # V is the first columns of the latent row
            planes: list[list[tuple[int, int]]] = [[(layer, 0) for layer in layers]]
        elif len(tensors) == 1:  # K and V in one allocation, K layers first
            planes = [[(layer, 0) for layer in layers] + [(layer, 1) for layer in layers]]
        else:
            planes = [[(layer, 0) for layer in layers], [(layer, 1) for layer in layers]]
        return cls(tensors, planes, executor.page_size)

    def unpoisoned_pages(self, pages: list[int]) -> list[int]:
        """Those of ``pages`` (of ``size`` rows each) that are not wholly the poison."""
        bad = np.zeros(len(pages), dtype=bool)
        for group in self.groups:
            bad |= group.unpoisoned_pages(pages, self.page_size)
        return [pages[i] for i in np.flatnonzero(bad)]

    def write(self, slots: Sequence[int], contents: Sequence[Content]) -> None:
        """Write the tags of ``contents`` at ``slots`` in every plane (the forward pass's writes)."""
        if not len(slots):
            return
        index = np.asarray(slots, dtype=np.int64)
        pairs = _pairs(contents)
        for group in self.groups:
            for planes in group.chunks(len(index)):
                group.write(index, group.expected(pairs[:, 0], pairs[:, 1], planes), planes)

    def write_with(self, slots: Sequence[int], other: TagLayout, other_slots: Sequence[int],
                   contents: Sequence[Content]) -> None:
        """Write ``contents`` at ``slots`` here and at ``other_slots`` in ``other`` (a second
        pool the same tokens are written to), computing the tags of both at once when the
        two share a row width and dtype; mutates both layouts' tensors."""
        groups = [*self.groups, *other.groups]
        first = groups[0]
        width = first.width
        planes = sum(len(group.planes) for group in groups)
        if any(g.width != width or g.lut is not first.lut for g in groups) or \
                len(slots) * width * planes > _CHUNK:
            self.write(slots, contents)
            other.write(other_slots, contents)
            return
        pairs = _pairs(contents)
        consts = np.concatenate([group.consts for group in groups])
        tags = first.lut[tag_array(pairs[:, 0], pairs[:, 1], consts, width)]
        here, there = np.asarray(slots, dtype=np.int64), np.asarray(other_slots, dtype=np.int64)
        offset = 0
        for number, group in enumerate(groups):
            count = len(group.planes)
            group.write(here if number < len(self.groups) else there, tags[offset:offset + count])
            offset += count

    def mismatches(self, slots: Sequence[int] | np.ndarray, contents: Sequence[Content]
                   ) -> np.ndarray:
        """Indices of the rows whose bytes at ``slots`` are not the tags of ``contents`` (read-only)."""
        index = np.asarray(slots, dtype=np.int64)
        if not len(index):
            return np.zeros(0, dtype=np.int64)
        pairs = _pairs(contents)
        special = np.flatnonzero(pairs[:, 0] < 0)
        tagged = np.flatnonzero(pairs[:, 0] >= 0) if len(special) else None
        bad = np.zeros(len(index), dtype=bool)
        for group in self.groups:
            got = group.read(index)
            if tagged is None:  # the usual case: every row holds a tag
                for planes in group.chunks(len(index)):
                    want = group.expected(pairs[:, 0], pairs[:, 1], planes)
                    bad |= (got[planes] != want).any(axis=(0, 2))
                continue
            poisoned = special[pairs[special, 0] == POISON_UID]
            if len(poisoned):
                bad[poisoned] |= (got[:, poisoned, :] != group.poison).any(axis=(0, 2))
            null = special[pairs[special, 0] == NULL_UID]
            if len(null):  # a null-page position reads the padding row as it is
                bad[null] |= (got[:, null, :] != group.read(pairs[null, 1])).any(axis=(0, 2))
            if len(tagged):
                rows = got[:, tagged, :]
                for planes in group.chunks(len(tagged)):
                    want = group.expected(pairs[tagged, 0], pairs[tagged, 1], planes)
                    bad[tagged] |= (rows[planes] != want).any(axis=(0, 2))
        return np.flatnonzero(bad)

    def first_bad_layer(self, slot: int, content: Content) -> int:
        """The first layer at which ``slot`` does not hold ``content`` (for messages)."""
        for group in self.groups:
            row = self.mismatches_by_plane(group, slot, content)
            if row is not None:
                return row
        return 0

    @staticmethod
    def mismatches_by_plane(group: _Group, slot: int, content: Content) -> int | None:
        got = group.read(np.array([slot], dtype=np.int64))
        if content[0] == POISON_UID:
            want = np.full_like(got, group.poison)
        elif content[0] == NULL_UID:
            want = group.read(np.array([content[1]], dtype=np.int64))
        else:
            want = group.expected(np.array([content[0]]), np.array([content[1]]))
        for plane, (layer, _salt) in enumerate(group.planes):
            if (got[plane] != want[plane]).any():
                return layer
        return None

    def read_layer(self, slots: np.ndarray, layer: int, salt: int) -> np.ndarray | None:
        """Words ``[n, width]`` at ``slots`` of one plane, or None if the layout has no such plane."""
        where = self.where.get((layer, salt))
        if where is None:
            return None
        group, plane = where
        return self.groups[group].read(slots)[plane]

    def expected_layer(self, contents: Sequence[Content], layer: int, salt: int) -> np.ndarray:
        """Expected words ``[n, width]`` of ``contents`` in one plane (salt 0 if it has no own plane)."""
        group_index, plane = self.where.get((layer, salt)) or self.where[(layer, 0)]
        group = self.groups[group_index]
        pairs = _pairs(contents)
        want = group.expected(pairs[:, 0], pairs[:, 1], slice(plane, plane + 1))[0]
        for row in np.flatnonzero(pairs[:, 0] < 0):
            if pairs[row, 0] == POISON_UID:
                want[row] = group.poison
            else:
                want[row] = group.read(pairs[row:row + 1, 1])[plane, 0]
        return want
