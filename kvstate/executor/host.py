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

from kvstate.executor.copies import copy_rows


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
        self._buffers = [
            torch.zeros((t.shape[0], rows, *t.shape[2:]), dtype=t.dtype, device="cpu", pin_memory=pin)
            for t in _device_buffers(executor)
        ]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._buffers)

    def _slots(self, pages: Sequence[int], limit: int) -> list[int]:
        size = self.page_size
        for page in pages:
            if not 0 <= page < limit:
                raise IndexError(f"page {page} outside 0..{limit - 1}")
        return [page * size + k for page in pages for k in range(size)]

    def offload(self, device_pages: Sequence[int], host_pages: Sequence[int]) -> None:
        """Copy device pages to host pages, every layer (a backup; the device keeps its copy)."""
        if len(device_pages) != len(host_pages):
            raise ValueError("offload needs one host page per device page")
        self.offload_slots(self._slots(device_pages, self.executor.num_pages + 1),
                           self._slots(host_pages, self.num_pages))

    def load(self, host_pages: Sequence[int], device_pages: Sequence[int]) -> None:
        """Copy host pages back into device pages, every layer."""
        if len(device_pages) != len(host_pages):
            raise ValueError("load needs one device page per host page")
        self.load_slots(self._slots(host_pages, self.num_pages),
                        self._slots(device_pages, self.executor.num_pages + 1))

    def offload_slots(self, device_slots: Sequence[int], host_slots: Sequence[int]) -> None:
        for host, device in zip(self._buffers, _device_buffers(self.executor), strict=True):
            copy_rows(host, device, device_slots, host_slots)
        if self.executor.device.type == "cuda":  # the host copy must be complete when we return
            torch.cuda.current_stream(self.executor.device).synchronize()

    def load_slots(self, host_slots: Sequence[int], device_slots: Sequence[int]) -> None:
        for host, device in zip(self._buffers, _device_buffers(self.executor), strict=True):
            copy_rows(device, host, host_slots, device_slots)
        if self.executor.device.type == "cuda":
            torch.cuda.current_stream(self.executor.device).synchronize()

    def read(self, layer: int, host_slots: Sequence[int]) -> list[torch.Tensor]:
        """Host rows of one layer (K then V, or the latent row), as fresh tensors."""
        index = torch.tensor(list(host_slots), dtype=torch.int64)
        return [buffer[layer].index_select(0, index) for buffer in self._buffers]


def _device_buffers(executor: Any) -> list[torch.Tensor]:
    if hasattr(executor, "_kv"):
        return [executor._kv]
    return [executor._k, executor._v]
