"""Errors of the seed-002 manager (beyond ``KeyError``/``ValueError``/``TypeError``).

Every error the manager raises leaves the core state and the stored values
exactly as they were.  ``ReservationExceeded`` and ``BufferAllocationError``
are ``OutOfMemory`` errors (``MemoryError``s): capacity conditions, not
mistakes by the caller.
"""

from __future__ import annotations

from kvstate.errors import OutOfMemory


class ReservationExceeded(OutOfMemory):
    """A basic-mode append past ``prompt_tokens + max_gen_tokens`` for one layer."""

    def __init__(self, request_id: str, layer: int, reserved: int) -> None:
        self.request_id = request_id
        self.layer = layer
        self.reserved = reserved
        super().__init__(reserved + 1, reserved, "tokens")
        self.args = (f"request {request_id!r} layer {layer} already stores all {reserved} "
                     f"reserved tokens (prompt_tokens + max_gen_tokens); allocate a larger "
                     f"reservation or use paged mode",)

    def __str__(self) -> str:
        return str(self.args[0])


class BufferAllocationError(OutOfMemory):
    """The value buffers for the budget could not be allocated (at the first append)."""

    def __init__(self, nbytes: int, device: str, cause: BaseException) -> None:
        self.nbytes = nbytes
        self.device = device
        super().__init__(nbytes, 0, f"bytes of K/V buffers on {device}")
        self.args = (f"could not allocate {nbytes} bytes of K/V buffers on {device} for "
                     f"max_gpu_memory_bytes: {cause}",)

    def __str__(self) -> str:
        return str(self.args[0])


class ModeError(RuntimeError):
    """A call that does not fit the manager's mode (basic vs paged, prefix cache off)."""
