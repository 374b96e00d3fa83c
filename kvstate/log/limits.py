"""What a reader accepts from a log header: the geometry limits and the unit of a slot.

A header is 113 bytes whatever it declares, so its numbers are bounded
before anything is built from them.  Building a state costs no memory per
page any more (free lists are ranges), but a fingerprint still costs time
linear in the pages and rows (about 0.13 s per million on the reference
machine, and replay fingerprints the initial state, every checkpoint and the
end), so the defaults keep one fingerprint near two seconds.  Past a limit
the reader raises ``LogLimitError`` (exit 2); ``--max-pages``,
``--max-rows`` and ``--max-host-pages`` raise them.  Owned by the log layer;
pure.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvstate.state import Geometry

DEFAULT_MAX_PAGES = 1 << 24  # 16.8M pages: 8.6G tokens at 512-token pages
DEFAULT_MAX_ROWS = 1 << 20
DEFAULT_MAX_HOST_PAGES = 1 << 24
DEFAULT_MAX_PAGE_SIZE = 1 << 20

# Header ``meta`` key: how many model tokens one slot of the log stands for.  A
# simulation that models a 512-token block as one page of one slot says 512, and
# replay scales token counts by it and says so.  Absent: 1 (a slot is a token).
TOKENS_PER_SLOT = "tokens_per_slot"
MAX_TOKENS_PER_SLOT = 1 << 20


@attrs.frozen
class Limits:
    """The largest geometry a reader builds a state for (see the module docstring)."""

    max_pages: int = DEFAULT_MAX_PAGES
    max_rows: int = DEFAULT_MAX_ROWS
    max_host_pages: int = DEFAULT_MAX_HOST_PAGES
    max_page_size: int = DEFAULT_MAX_PAGE_SIZE


DEFAULT_LIMITS = Limits()


def check_limits(geometry: Geometry, host_pages: int, limits: Limits) -> str | None:
    """Why the header is refused (None: accepted)."""
    for what, value, limit, option in (
            ("pages", geometry.num_pages, limits.max_pages, "--max-pages"),
            ("rows", geometry.num_rows, limits.max_rows, "--max-rows"),
            ("host pages", host_pages, limits.max_host_pages, "--max-host-pages"),
            ("tokens per page", geometry.page_size, limits.max_page_size, None)):
        if value > limit:
            how = f"; raise it with {option}" if option else ""
            return f"the header declares {value} {what}, over the limit of {limit}{how}"
    return None


def meta_problem(meta: dict[str, Any]) -> str | None:
    """Why the header's ``meta`` is refused (None: accepted): only known keys are typed."""
    unit = meta.get(TOKENS_PER_SLOT, 1)
    if type(unit) is not int or not 1 <= unit <= MAX_TOKENS_PER_SLOT:
        return f"meta.{TOKENS_PER_SLOT} must be an int in 1..{MAX_TOKENS_PER_SLOT}, got {unit!r}"
    return None


def tokens_per_slot(meta: dict[str, Any]) -> int:
    """The header's ``tokens_per_slot`` (validated by the reader), 1 when absent."""
    value = meta.get(TOKENS_PER_SLOT, 1)
    return value if type(value) is int and value >= 1 else 1
