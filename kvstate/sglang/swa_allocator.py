"""SGLang 0.5.23's ``SWATokenToKVPoolAllocator`` on the kvstate core (FULL + SWA pools).

Two pools page in step: each allocation takes FULL pages and as many SWA
pages from the heads of their free lists and pairs them (``Allocate``, then
``SwaAlloc``); ``full_to_swa_index_mapping`` (a real int64 tensor of length
``size + page_size + 1``, 0 = no SWA peer, a trailing -1 for ``last_loc`` =
-1) mirrors the pairing slot by slot as SGLang writes it
(``kvstate.sglang.swa_views.MappingMirror``).  Frees
release SWA first (``SwaFree``: it reads the pairing), then FULL (``Free`` /
``FreeMapped``), where SGLang's sub-allocators put them: page size 1 at the
tail in the order given; paged ``free`` sorted at the head, segments and page
ids at the head in row order.  ``free_group_begin`` / ``free_group_end``
park the frees and release them in 0.5.23's group order (SWA page ids, SWA
set frees, then the FULL group).

Departures (docs/deviations.md): ``alloc`` also serves page sizes > 1 (whole
pages, paired in step; 0.5.23 asserts page size 1 there); the sub-allocators
are read-only views; freeing a slot twice or an unpaired slot through
``free_swa_segment`` raises ``InvalidEvent`` / ``ValueError`` instead of
corrupting the pools.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvstate.engine import Engine
from kvstate.events import Allocate
from kvstate.invariants import Violation
from kvstate.planner.alloc import decode_slots, extend_slots, new_pages_for_extend
from kvstate.planner.swa_requests import plan_paired_pages
from kvstate.sglang.binding import FrontEndMixin, engine_for_allocator
from kvstate.sglang.frees import ParkedPages
from kvstate.sglang.inputs import (
    as_int,
    bind_forms,
    decode_args,
    extend_form,
    extend_form_0523,
    int64_tensor,
    int_list,
)
from kvstate.sglang.params import EvictParams
from kvstate.sglang.swa_frees import SwaFreesMixin
from kvstate.sglang.swa_views import MappingMirror, PoolView


class SWATokenToKVPoolAllocator(SwaFreesMixin, FrontEndMixin):
    def __init__(self, size: int, size_swa: int, page_size: int = 1,
                 dtype: torch.dtype = torch.float16, device: str = "cpu", kvcache: Any = None,
                 need_sort: bool = False, req_to_token_pool: Any = None, *,
                 engine: Engine | None = None) -> None:
        for name, value in (("size", size), ("size_swa", size_swa), ("page_size", page_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if need_sort:
            raise ValueError("need_sort (PD disaggregation's deferred frees) is not modelled")
        if size % page_size or size_swa % page_size:
            raise ValueError("size and size_swa must be whole pages")
        self._size_full, self._size_swa, self.page_size = size, size_swa, page_size
        self.dtype, self.device, self._kvcache = dtype, device, kvcache
        if req_to_token_pool is not None and engine is None:
            engine = req_to_token_pool.engine
        self.engine = engine_for_allocator(size // page_size, page_size, engine)
        swa = self.engine.initial_state.swa
        if self.engine.seq == 0:
            self.engine.configure(swa_pages=size_swa // page_size)
        elif swa is None or swa.num_pages != size_swa // page_size:
            raise ValueError("the engine already holds no SWA pool of this size")
        self.full_attn_allocator = PoolView(self, "full", size)
        self.swa_attn_allocator = PoolView(self, "swa", size_swa)
        self.full_to_swa_index_mapping = torch.zeros(size + page_size + 1, dtype=torch.int64,
                                                     device=device)
        self.full_to_swa_index_mapping[-1] = -1
        self._mirror = MappingMirror(self.full_to_swa_index_mapping, page_size)
        self._mirror.rebuild(self.engine.view)
        self.engine.subscribe(self._mirror)
        self._group: dict[str, list[list[int]]] | None = None
        self._parked = ParkedPages()  # the open group's pages, to refuse a bad free early
        if kvcache is not None:  # an executor follows the engine and writes through our mapping
            if hasattr(kvcache, "attach"):
                kvcache.attach(self.engine)
            if hasattr(kvcache, "register_mapping"):
                kvcache.register_mapping(self.full_to_swa_index_mapping)

    # -- sizes ----------------------------------------------------------------------
    @property
    def size(self) -> int:
        return min(self._size_full, self._size_swa)

    @property
    def size_full(self) -> int:
        return self._size_full

    @property
    def size_swa(self) -> int:
        return self._size_swa

    def full_available_size(self) -> int:
        return len(self.engine.view.free_pages) * self.page_size

    def swa_available_size(self) -> int:
        return len(self.engine.view.swa.free_pages) * self.page_size

    def available_size(self) -> int:
        return min(self.full_available_size(), self.swa_available_size())

    def get_kvcache(self) -> Any:
        return self._kvcache

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        return self.full_to_swa_index_mapping[kv_indices.to(torch.int64)]

    def verify(self) -> list[Violation]:
        """Compare ``full_to_swa_index_mapping`` with the state's pairing (one ``Violation``
        per slot that differs; a slot not yet handed out may read 0)."""
        return [Violation("full_to_swa_index_mapping", message)
                for message in self._mirror.violations(self.engine.view)]

    def evict_to_free_tokens(self, tree_cache: Any, num_tokens: int) -> None:
        """Ask the tree for each pool's shortfall (``evict_for_alloc``)."""
        if tree_cache is None or not tree_cache.supports_prefix_sharing():
            return
        count = as_int(num_tokens, "num_tokens")
        full = max(0, count - self.full_available_size())
        swa = max(0, count - self.swa_available_size())
        if full or swa:
            tree_cache.evict_for_alloc(EvictParams(num_tokens=full, swa_num_tokens=swa))

    # -- allocation -------------------------------------------------------------------
    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` FULL slots paired with as many SWA slots, or ``None`` if either pool
        is short.  Commits ``Allocate`` and ``SwaAlloc``."""
        need = as_int(need_size, "need_size")
        if need % self.page_size:
            raise ValueError(f"alloc({need}) is not a multiple of page size {self.page_size}")
        count = need // self.page_size
        view = self.engine.view
        if count > len(view.free_pages) or count > len(view.swa.free_pages):
            return None
        pages = view.free_pages.head(count)
        slots = self._slots(pages)
        self._allocate(pages, slots.tolist())
        return slots

    def alloc_extend(self, *args: Any, **kwargs: Any) -> torch.Tensor | None:
        """SGLang's three-part extend on both pools in step (0.5.23's or the short form);
        ``None`` when either pool is short.  Commits ``Allocate`` and ``SwaAlloc``."""
        bound = bind_forms("alloc_extend", args, kwargs, extend_form_0523, extend_form)
        prefixes = int_list(bound["prefix_lens"], "prefix_lens")
        seqs = int_list(bound["seq_lens"], "seq_lens")
        lasts = int_list(bound["last_loc"], "last_loc", low=-1,  # as alloc_decode bounds it
                         high=(self.engine.geometry.num_pages + 1) * self.page_size - 1)
        if not len(prefixes) == len(seqs) == len(lasts):
            raise ValueError("prefix_lens, seq_lens and last_loc need one entry per request")
        size = self.page_size
        for prefix, seq, last in zip(prefixes, seqs, lasts, strict=True):
            if seq < prefix or (last + 1) % size != prefix % size:
                raise ValueError(f"seq_len {seq}, prefix_len {prefix} and last_loc {last} "
                                 "do not fit one row")
            self._check_partial(last, prefix)
        needed = sum(new_pages_for_extend(size, p, s) for p, s in zip(prefixes, seqs, strict=True))
        pages = self._take(needed)
        if pages is None:
            return None
        slots = extend_slots(size, list(zip(prefixes, seqs, lasts, strict=True)), pages)
        flat = [s for group in slots for s in group]
        self._allocate(pages, flat)
        return int64_tensor(flat)

    def alloc_decode(self, *args: Any, **kwargs: Any) -> torch.Tensor | None:
        """One slot per request (``seq_lens`` after the token), both pools in step.
        Commits ``Allocate`` and ``SwaAlloc``."""
        seqs, lasts = decode_args(args, kwargs, self.page_size,
                                  self.engine.geometry.num_pages)
        size = self.page_size
        for seq, last in zip(seqs, lasts, strict=True):
            self._check_partial(last, seq - 1)
        pages = self._take(sum(1 for seq in seqs if (seq - 1) % size == 0))
        if pages is None:
            return None
        slots = decode_slots(size, [(s - 1, last) for s, last in zip(seqs, lasts, strict=True)],
                             pages)
        self._allocate(pages, slots)
        return int64_tensor(slots)

    def map_slots(self, batch: Any, slots: Sequence[int]) -> None:
        """FULL ``slots`` the decision in the open ``batch`` handed out (their pages paired):
        map each to its SWA slot when the batch commits, as the allocator does for its own
        allocations."""
        self._mirror.hand_out_at_commit(batch, slots)

    def _check_partial(self, last_loc: int, length: int) -> None:
        """A row that continues a partial page needs that page's SWA peer (SGLang
        translates ``last_loc`` through the mapping)."""
        if not length % self.page_size:
            return
        mapping = self.full_to_swa_index_mapping
        if not 0 <= last_loc < len(mapping) or int(mapping[last_loc]) <= 0:
            raise ValueError(f"last_loc {last_loc} has no SWA slot to continue")

    def _take(self, count: int) -> list[int] | None:
        view = self.engine.view
        if count > len(view.free_pages) or count > len(view.swa.free_pages):
            return None
        return view.free_pages.head(count)

    def _allocate(self, pages: list[int], slots: Sequence[int]) -> None:
        """Take ``pages`` and as many SWA pages from the heads (``Allocate``, ``SwaAlloc``);
        map the handed-out ``slots`` at the commit (those of continued partial pages are
        paired already)."""
        with self.engine.batch() as batch:
            if pages:
                batch.emit(Allocate(tuple(pages)))
                plan_paired_pages(batch, pages)
            self.map_slots(batch, slots)

    def _slots(self, pages: Sequence[int]) -> torch.Tensor:
        size = self.page_size
        return int64_tensor(list(pages) if size == 1 else
                            [page * size + k for page in pages for k in range(size)])


__all__ = ["PoolView", "SWATokenToKVPoolAllocator"]
