"""The host tier's buffers: a second K/V pool in host memory (pinned when CUDA is present).

``HostPool`` mirrors its device executor's layout with ``num_pages`` host
pages (host pages are ``0..num_pages-1``; unlike the device there is no
padding page, as in SGLang's ``HostKVCache``).  It owns only its tensors;
which host page holds which tree node's KV is core state, and the byte moves
are driven by offload/load events through :meth:`offload` and :meth:`load`.
Both calls mutate buffers only (host, resp. device).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvstate.executor.copies import PageViews, copy_pages_between, copy_rows, paired_pages


class HostPool:
    """Host K/V buffers shaped like ``executor``'s, for ``num_pages`` pages."""

    def __init__(self, executor: Any, num_pages: int, *, pin_memory: bool | None = None) -> None:
        if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages <= 0:
            raise ValueError(f"num_pages must be a positive int, got {num_pages!r}")
        self.executor = executor
        self.num_pages = num_pages
        self.page_size = executor.page_size
        pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        rows = num_pages * self.page_size
        self.pinned = pin
        self._pages = [  # shaped like the device's page tensors (K and V together if they are)
            torch.zeros((t.shape[0], rows, *t.shape[2:]), dtype=t.dtype, device="cpu", pin_memory=pin)
            for t in executor.page_views.tensors
        ]
        self.page_views = PageViews(self._pages, self.page_size)
        device_rows = executor.row_buffers
        if len(self._pages) == 1 and len(device_rows) > 1:  # host K and V as views, like the device's
            self._buffers = list(self._pages[0].split([t.shape[0] for t in device_rows]))
        else:
            self._buffers = self._pages

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._pages)

    def offload(self, device_pages: Sequence[int], host_pages: Sequence[int]) -> None:
        """Copy device pages to host pages, every layer (a backup; the device keeps its copy)."""
        if len(device_pages) != len(host_pages):
            raise ValueError("offload needs one host page per device page")
        copy_pages_between(self.page_views, self.executor.page_views, device_pages, host_pages)
        self._sync()

    def load(self, host_pages: Sequence[int], device_pages: Sequence[int]) -> None:
        """Copy host pages back into device pages, every layer."""
        if len(device_pages) != len(host_pages):
            raise ValueError("load needs one device page per host page")
        copy_pages_between(self.executor.page_views, self.page_views, host_pages, device_pages)
        self._sync()

    def offload_slots(self, device_slots: Sequence[int], host_slots: Sequence[int]) -> None:
        """Slot form of :meth:`offload` (what index plans carry); whole pages take the page path."""
        paired = paired_pages(device_slots, host_slots, self.page_size)
        if paired is not None:
            self.offload(*paired)
            return
        for host, device in zip(self._buffers, self.executor.row_buffers, strict=True):
            copy_rows(host, device, device_slots, host_slots)
        self._sync()

    def load_slots(self, host_slots: Sequence[int], device_slots: Sequence[int]) -> None:
        """Slot form of :meth:`load`; whole pages take the page path."""
        paired = paired_pages(host_slots, device_slots, self.page_size)
        if paired is not None:
            self.load(*paired)
            return
        for host, device in zip(self._buffers, self.executor.row_buffers, strict=True):
            copy_rows(device, host, host_slots, device_slots)
        self._sync()

    def _sync(self) -> None:
        if self.executor.device.type == "cuda":  # the copy must be complete when we return
            torch.cuda.current_stream(self.executor.device).synchronize()

    def read(self, layer: int, host_slots: Sequence[int] | torch.Tensor) -> list[torch.Tensor]:
        """Host rows of one layer (K then V, or the latent row), as fresh tensors.

        ``host_slots`` may be a prebuilt int64 CPU index (reused across layers).
        """
        index = torch.as_tensor(host_slots, dtype=torch.int64, device="cpu")
        return [buffer[layer].index_select(0, index) for buffer in self._buffers]

