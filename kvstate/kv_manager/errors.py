"""Errors of the seed-002 manager (beyond ``KeyError``/``ValueError``/``TypeError``).

``ReservationExceeded`` is an ``OutOfMemory`` (a ``MemoryError``): a basic-mode
request wrote every token it reserved and asked for one more.  Nothing is
changed when it is raised.
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


class ModeError(RuntimeError):
    """A call that does not fit the manager's mode (basic vs paged, prefix cache off)."""
