"""The typed errors of reads a kernel must not make, raised by the exports.

Each is a ``ValueError`` naming what was read; the integrity monitor
reports the same failures in its ``IntegrityReport`` with the same words
("use after free", "SWA window lost", "Mamba state lost").  Pure classes:
no state, no torch::

    UseAfterFree     a table entry whose page was freed under the row (``FreeMapped``)
    SwaKVLost        a sliding-window read of a position whose FULL page has no SWA page
    MambaStateLost   a batch row with no running Mamba state (its slots freed or in the tree)
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstate.state import RequestId


class UseAfterFree(ValueError):
    """A read of table entries whose page was freed under the row (``FreeMapped``).

    ``request`` is the request, ``positions`` the first dangling positions
    asked for (one table index: ``start..stop - 1``) and ``page`` the freed
    page they map; ``dangling`` lists every dangling table index of the read.
    """

    def __init__(self, request: RequestId, positions: range, page: int,
                 dangling: Sequence[int]) -> None:
        self.request = request
        self.positions = positions
        self.page = page
        self.dangling = tuple(dangling)
        more = f" (and {len(dangling) - 1} more dangling pages)" if len(dangling) > 1 else ""
        super().__init__(f"use after free: request {request!r} positions {positions.start}.."
                         f"{positions.stop - 1} map page {page}, which was freed under the row "
                         f"(FreeMapped) and not rewritten, truncated or closed since{more}")


class SwaKVLost(ValueError):
    """A sliding-window read of a position whose FULL page has no SWA page (freed or evicted).

    ``request``, ``position`` and the FULL ``page`` name the lost window token.
    """

    def __init__(self, request: RequestId, position: int, page: int) -> None:
        self.request, self.position, self.page = request, position, page
        super().__init__(f"SWA window lost: request {request!r} position {position} maps FULL "
                         f"page {page}, which has no SWA page (its SWA KV was freed or evicted)")


class MambaStateLost(ValueError):
    """A batch row whose Mamba state the state does not give it (no running slot, or no
    Mamba slots at all: they were freed or went to the tree).  ``request`` names the row."""

    def __init__(self, request: RequestId, detail: str) -> None:
        self.request = request
        super().__init__(f"Mamba state lost: request {request!r} {detail}")


__all__ = ["MambaStateLost", "SwaKVLost", "UseAfterFree"]
