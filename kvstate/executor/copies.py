"""Moving KV rows between buffers: whole-page copies, run coalescing and integer-word copies.

Pure data-plane helpers over ``[layers, rows, ...]`` tensors, where rows
``p * P .. p * P + P - 1`` are page ``p``.  ``PageViews`` owns nothing but a
cache of per-page views of its caller's tensors; ``copy_pages_between`` and
``copy_rows`` mutate their destination only; ``raw_words`` returns a view.

Why whole pages are special: one page of one tensor is a ``[layers, P * row]``
strided block (one contiguous piece per layer).  Copying a few hundred such
blocks one ``copy_`` call at a time costs more in per-call overhead than in
memory traffic at 16-token pages, so pages are handed to torch in one
``_foreach_copy_`` call over cached views (CPU), and runs of adjacent pages are
merged into one view first.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import torch

_FOREACH_COPY = getattr(torch, "_foreach_copy_", None)


_ELEMENT_INTS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_PATTERNS: dict[tuple[torch.dtype, str], int] = {}


def bit_pattern(dtype: torch.dtype, value: float) -> int:
    """The integer with the bits of ``value`` stored as one ``dtype`` element (cached)."""
    key = (dtype, repr(value))
    pattern = _PATTERNS.get(key)
    if pattern is None:
        element = torch.zeros(1, dtype=dtype).fill_(value)
        pattern = _PATTERNS[key] = int(element.view(_ELEMENT_INTS[element.element_size()])[0])
    return pattern


def slot_runs(src: Sequence[int], dst: Sequence[int]) -> list[tuple[int, int, int]]:
    """Coalesce parallel slot lists into ``(src_start, dst_start, length)`` runs.

    A run never reads what it writes: a chain such as ``1->2, 2->3`` stays
    one-by-one, so running the runs in order equals running the pairs in order.
    """
    runs: list[tuple[int, int, int]] = []
    for s, d in zip(src, dst, strict=True):
        if runs:
            rs, rd, n = runs[-1]
            if rs + n == s and rd + n == d and abs(rs - rd) > n:
                runs[-1] = (rs, rd, n + 1)
                continue
        runs.append((s, d, 1))
    return runs


def whole_pages(slots: Sequence[int], page_size: int) -> list[int] | None:
    """The pages of ``slots`` if they are whole pages in order (``p*P .. p*P+P-1`` each), else None.

    Slot tuples built by the index plans (``plan.PageSlots``) carry their
    pages and are answered without a scan.
    """
    known = getattr(slots, "pages", None)
    if known is not None and getattr(slots, "page_size", None) == page_size:
        return list(known) if known else None
    count = len(slots)
    if count == 0 or count % page_size:
        return None
    listed = list(slots)
    firsts = listed[::page_size]
    if any(first % page_size for first in firsts):
        return None
    if list(chain.from_iterable(range(first, first + page_size) for first in firsts)) != listed:
        return None
    return [first // page_size for first in firsts]


def paired_pages(src_slots: Sequence[int], dst_slots: Sequence[int], page_size: int
                 ) -> tuple[list[int], list[int]] | None:
    """``(src_pages, dst_pages)`` when both slot lists are whole pages in order, else None.

    Raises ``ValueError`` when the lists differ in length.
    """
    if len(src_slots) != len(dst_slots):
        raise ValueError(f"{len(src_slots)} source slots but {len(dst_slots)} destination slots")
    src_pages = whole_pages(src_slots, page_size)
    if src_pages is None:
        return None
    dst_pages = whole_pages(dst_slots, page_size)
    return None if dst_pages is None else (src_pages, dst_pages)


def raw_words(tensor: torch.Tensor, leading: int = 2) -> torch.Tensor:
    """Reinterpret a contiguous tensor as ``[*shape[:leading], words]`` of the widest int type.

    Moves on integer words take torch's plain memcpy-like paths; half-precision
    strided copies do not.  Returns a view (no copy); writes go to ``tensor``.
    """
    trailing = 1
    for extent in tensor.shape[leading:]:
        trailing *= extent
    flat = tensor.reshape(*tensor.shape[:leading], trailing)
    row_bytes = flat.shape[-1] * flat.element_size()
    for dtype, width in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if row_bytes % width == 0 and flat.element_size() <= width:
            return flat.view(dtype)
    return flat.view(torch.uint8)


class PageViews:
    """Per-page integer-word views of a group of ``[layers, num_pages * P, ...]`` tensors.

    ``tensors`` stay owned by the caller; this object only caches views of
    them (built on first use of a page, at most one per page and tensor).
    ``page(p)`` is a tuple with one ``[layers, P * row_words]`` view per tensor.
    """

    def __init__(self, tensors: Sequence[torch.Tensor], page_size: int) -> None:
        if not tensors:
            raise ValueError("PageViews needs at least one tensor")
        rows = tensors[0].shape[1]
        if rows % page_size or any(t.shape[1] != rows for t in tensors):
            raise ValueError(f"tensors must share a row count that is a multiple of {page_size}")
        self.tensors = tuple(tensors)
        self.page_size = page_size
        self.num_pages = rows // page_size
        self.words = tuple(raw_words(t).view(t.shape[0], self.num_pages, -1) for t in tensors)
        self._cache: list[tuple[torch.Tensor, ...] | None] = [None] * self.num_pages
        # Element-wise integer views ``[layers, pages, P * row]`` for fills; numpy on the CPU.
        self._elements = tuple(t.view(_ELEMENT_INTS[t.element_size()]).view(t.shape[0],
                                                                           self.num_pages, -1)
                               for t in tensors)
        self._arrays = tuple(e.numpy() if e.device.type == "cpu" else None for e in self._elements)

    def page(self, page: int) -> tuple[torch.Tensor, ...]:
        cached = self._cache[page]
        if cached is None:
            cached = self._cache[page] = tuple(words[:, page] for words in self.words)
        return cached

    def span(self, first: int, count: int) -> tuple[torch.Tensor, ...]:
        """Views of pages ``first .. first + count - 1`` (``[layers, count, words]`` each)."""
        if count == 1:
            return self.page(first)
        return tuple(words[:, first:first + count] for words in self.words)

    def check(self, pages: Sequence[int]) -> None:
        if pages and (min(pages) < 0 or max(pages) >= self.num_pages):
            raise IndexError(f"page outside 0..{self.num_pages - 1}")

    def fill(self, pages: Sequence[int], value: float) -> None:
        """Set every element of ``pages`` (every tensor, every layer) to ``value``.

        On the CPU through numpy views of the same memory (one call per
        tensor, no index tensor to build); elsewhere one ``index_fill_``.
        """
        self.check(pages)
        index = list(pages)
        for tensor, elements, array in zip(self.tensors, self._elements, self._arrays,
                                           strict=True):
            pattern = bit_pattern(tensor.dtype, value)
            if array is not None:
                array[:, index, :] = pattern
            else:
                elements.index_fill_(1, torch.tensor(index, dtype=torch.int64,
                                                     device=tensor.device), pattern)


def copy_pages_between(dst: PageViews, src: PageViews, src_pages: Sequence[int],
                       dst_pages: Sequence[int]) -> None:
    """Copy page ``src_pages[i]`` of ``src`` to page ``dst_pages[i]`` of ``dst``, every tensor.

    Copies run in list order (a page written earlier is read later with its
    new bytes); runs of adjacent pages are one copy each.  Mutates ``dst``'s
    tensors only.  Across devices the copies are asynchronous on the current
    stream: the caller synchronizes before reading host memory (``HostPool``).
    """
    if len(src_pages) != len(dst_pages):
        raise ValueError(f"{len(src_pages)} source pages but {len(dst_pages)} destination pages")
    if len(src.words) != len(dst.words) or src.page_size != dst.page_size:
        raise ValueError("source and destination page groups differ in tensors or page size")
    src.check(src_pages)
    dst.check(dst_pages)
    targets: list[torch.Tensor] = []
    sources: list[torch.Tensor] = []
    for s, d, count in slot_runs(src_pages, dst_pages):  # runs of adjacent pages
        targets.extend(dst.span(d, count))
        sources.extend(src.span(s, count))
    _copy_all(targets, sources)


def copy_slots_within(pages: PageViews, tensors: Sequence[torch.Tensor], src_slots: Sequence[int],
                      dst_slots: Sequence[int]) -> None:
    """Copy rows ``src -> dst`` inside ``tensors`` (whose page views are ``pages``), all layers.

    Whole pages in order take the page path; anything else is copied by row
    runs.  Mutates ``tensors`` only.
    """
    paired = paired_pages(src_slots, dst_slots, pages.page_size)
    if paired is not None:
        copy_pages_between(pages, pages, *paired)
        return
    for tensor in tensors:
        copy_rows(tensor, tensor, src_slots, dst_slots)


def _copy_all(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    if not targets:
        return
    on_cpu = targets[0].device.type == "cpu" and sources[0].device.type == "cpu"
    if on_cpu and _FOREACH_COPY is not None:
        _FOREACH_COPY(targets, sources)
        return
    # Asynchronous on the current stream; a device-to-host copy is not complete
    # on return, so the caller (``HostPool``) waits for the stream before any
    # CPU read of the host buffers.
    for target, source in zip(targets, sources, strict=True):
        target.copy_(source, non_blocking=True)


def copy_rows(dst: torch.Tensor, src: torch.Tensor, src_rows: Sequence[int],
              dst_rows: Sequence[int], max_runs: int = 1024) -> None:
    """``dst[:, dst_rows] = src[:, src_rows]`` over dim 1 of ``[layers, rows, ...]`` tensors.

    Contiguous runs are copied slice by slice on integer-word views (no
    temporary); very many short runs fall back to one gather plus one
    scatter.  Mutates ``dst`` only.  Whole pages go faster through
    ``copy_pages_between``.  Across devices the run copies are asynchronous
    on the current stream, as in ``copy_pages_between``.
    """
    if len(src_rows) != len(dst_rows):
        raise ValueError(f"{len(src_rows)} source rows but {len(dst_rows)} destination rows")
    if not src_rows:
        return
    src_words, dst_words = raw_words(src), raw_words(dst)
    runs = slot_runs(src_rows, dst_rows)
    if len(runs) <= max_runs:
        _copy_all([dst_words[:, d:d + n] for _, d, n in runs],
                  [src_words[:, s:s + n] for s, _, n in runs])
        return
    src_index = torch.tensor(src_rows, dtype=torch.int64, device=src.device)
    dst_index = torch.tensor(dst_rows, dtype=torch.int64, device=dst.device)
    gathered = src_words.index_select(1, src_index)
    # Into host memory the transfer must be complete before the CPU scatter reads it.
    to_host = dst.device.type == "cpu" and src.device.type != "cpu"
    dst_words.index_copy_(1, dst_index, gathered.to(dst.device, non_blocking=not to_host))
