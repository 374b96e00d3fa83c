"""The seed-002 manager's two memory modes and the core geometry each one implies.

Part 1 and Part 2 of the seed size memory differently, so the first
allocation call picks the mode for a manager's lifetime (or pass ``mode=``):

* ``allocate`` -> basic: one core page per token over all layers, so the
  page count is exactly ``max_gpu_memory_bytes // bytes_per_token``;
* ``allocate_paged`` / ``enable_prefix_cache`` -> paged: one core page per
  ``page_size`` tokens of one layer.

Calling the other mode's allocator raises ``ModeError``.  The engine's
geometry is set when the mode is picked (``Engine.configure``, before any
event), so attach a log recorder after the first allocation or pass ``mode=``.

Ownership: ``KVCacheManager`` owns the chosen mode and its engine; the
functions here are pure (they compute sizes and raise ``ValueError`` on a bad
mode name) and mutate nothing.
"""

from __future__ import annotations

from kvstate.state import Geometry

BASIC = "basic"
PAGED = "paged"
# The most pages (basic mode: tokens) a manager tracks.  Attention kernels index
# pages with int32 (FlashInfer, vLLM block tables), and the core lists every page
# it hands out, so a budget past this is a mistake, not a bigger cache.
MAX_PAGES = 2**31 - 1


def check_mode(mode: str | None) -> str | None:
    """``mode`` unchanged if it is ``'basic'``, ``'paged'`` or ``None``; else ``ValueError``."""
    if mode is not None and mode not in (BASIC, PAGED):
        raise ValueError(f"mode must be 'basic', 'paged' or None, got {mode!r}")
    return mode


def check_capacity(max_tokens: int, max_pages: int) -> None:
    """``ValueError`` if either mode would track more than ``MAX_PAGES`` pages."""
    if max(max_tokens, max_pages) > MAX_PAGES:
        raise ValueError(f"the budget holds {max_tokens} tokens ({max_pages} one-layer pages); "
                         f"a manager tracks at most {MAX_PAGES} pages (int32 page ids)")


def mode_capacity(mode: str, max_tokens: int, max_pages: int) -> int:
    """Core pages the byte budget holds in ``mode`` (tokens in basic mode, one-layer pages in paged)."""
    return max_tokens if mode == BASIC else max_pages


def mode_geometry(mode: str, max_tokens: int, max_pages: int, page_size: int) -> Geometry:
    """The core geometry of ``mode``: at least one page, one token per page in basic mode."""
    pages = max(mode_capacity(mode, max_tokens, max_pages), 1)
    size = 1 if mode == BASIC else page_size
    return Geometry(num_pages=pages, page_size=size, row_width=pages * size)
